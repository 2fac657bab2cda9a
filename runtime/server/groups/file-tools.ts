import { BadRequestError } from '../errors.js';
import { deleteTool } from '../file-tools/delete.js';
import { editTool } from '../file-tools/edit.js';
import { answerOf } from '../file-tools/fs.js';
import { globTool } from '../file-tools/glob.js';
import { grepTool } from '../file-tools/grep.js';
import { lsTool } from '../file-tools/ls.js';
import {
  GLOB_STYLES,
  type GlobRequest,
  type GlobStyle,
  SEARCH_BUDGET_MS,
} from '../file-tools/protocol.js';
import { readTool } from '../file-tools/read.js';
import type { ServerRoute } from '../route-group.js';
import { argList } from '../validate.js';

function notNegative(args: Record<string, unknown>, ...names: string[]): void {
  const bad = names.filter((name) => typeof args[name] === 'number' && (args[name] as number) < 0);
  if (bad.length > 0) throw new BadRequestError(`${bad.join(' and ')} must not be negative`);
}

/**
 * BaseSandbox's file tools (`sandbox.read`, `edit`, `ls`, `delete`, `grep`, `glob`), answered by
 * the same code that the in-sandbox programs of its execute() path run (runtime/server/file-tools),
 * so both give the same answers. Bodies and answers are that protocol's (camelCase, like the
 * results they become); a failure of the tool itself is an answer, `200 { "error": code }`.
 * Relative paths resolve against the server's directory (in envd, the sandbox's workdir).
 */
export const FILE_TOOL_ROUTES: Omit<ServerRoute, 'group'>[] = [
  {
    method: 'POST',
    path: '/files/tools/read',
    summary:
      'A page of lines of a file (`offset`, `limit`), CRLF as LF, capped near 500 KiB; media and binary files as base64.',
    args: argList({
      path: 'str',
      'offset?': ['int', 0],
      'limit?': ['int', 2000],
      'media?': ['bool', false],
    }),
    handler: ({ args }) => {
      notNegative(args, 'offset', 'limit');
      const { path, offset, limit, media } = args as {
        path: string;
        offset: number;
        limit: number;
        media: boolean;
      };
      return answerOf(() => readTool({ path, offset, limit, media }));
    },
  },
  {
    method: 'POST',
    path: '/files/tools/edit',
    summary:
      'Replaces `old` by `new` (base64 of UTF-8) once, or every time with `replaceAll`; LF text matches a CRLF file.',
    args: argList({ path: 'str', old: 'str', new: 'str', 'replaceAll?': ['bool', false] }),
    handler: ({ args }) => {
      const { path, old, replaceAll } = args as { path: string; old: string; replaceAll: boolean };
      return answerOf(() => editTool({ path, old, new: args.new as string, replaceAll }));
    },
  },
  {
    method: 'POST',
    path: '/files/tools/ls',
    summary:
      'Entries of one directory, hidden ones included, with size and mtime; symlinks not followed.',
    args: argList({ path: 'str' }),
    handler: ({ args }) => answerOf(() => lsTool({ path: args.path as string })),
  },
  {
    method: 'POST',
    path: '/files/tools/delete',
    summary: 'Deletes a file, a symlink (even a broken one) or a whole directory tree.',
    args: argList({ path: 'str' }),
    handler: ({ args }) => answerOf(() => deleteTool({ path: args.path as string })),
  },
  {
    method: 'POST',
    path: '/files/tools/grep',
    summary:
      'Lines holding a literal substring in a file or under a directory (skipping /proc, /sys, /dev, /run), optionally only in files matching `glob`; stops at `maxCount` matches or after `budgetMs`.',
    args: argList({
      pattern: 'str',
      'path?': ['str', '.'],
      'glob?': 'str',
      'maxCount?': 'int',
      'budgetMs?': ['int', SEARCH_BUDGET_MS],
    }),
    handler: ({ args }) => {
      notNegative(args, 'maxCount', 'budgetMs');
      const { pattern, path, budgetMs } = args as {
        pattern: string;
        path: string;
        budgetMs: number;
      };
      const glob = (args.glob as string | undefined) ?? null;
      const maxCount = (args.maxCount as number | undefined) ?? null;
      return answerOf(() => grepTool({ pattern, path, glob, maxCount, budgetMs }));
    },
  },
  {
    method: 'POST',
    path: '/files/tools/glob',
    summary:
      'Entries matching a glob, sorted: files (dirs too, with `includeDirs`), absolute or `relative` to `path`. Style `reference`: without `/`, base names at any depth; `path`: the whole relative path, wildcards match dot-names. Skips /proc, /sys, /dev, /run. At most `maxResults`, in `budgetMs`.',
    args: argList({
      pattern: 'str',
      'path?': ['str', '.'],
      'maxResults?': ['int', 1000],
      'budgetMs?': ['int', SEARCH_BUDGET_MS],
      'style?': ['str', 'reference'],
      'includeDirs?': ['bool', false],
      'relative?': ['bool', false],
    }),
    handler: ({ args }) => {
      notNegative(args, 'maxResults', 'budgetMs');
      const request = args as unknown as GlobRequest;
      if (!GLOB_STYLES.includes(request.style as GlobStyle)) {
        throw new BadRequestError(
          `style must be one of ${GLOB_STYLES.map((s) => `'${s}'`).join(', ')}, not ${JSON.stringify(request.style)}`,
        );
      }
      const { pattern, path, maxResults, budgetMs, style, includeDirs, relative } = request;
      return answerOf(() =>
        globTool({ pattern, path, maxResults, budgetMs, style, includeDirs, relative }),
      );
    },
  },
];
