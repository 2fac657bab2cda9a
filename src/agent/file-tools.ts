import type { BaseSandbox } from './base-sandbox.js';
import { ToolCallError } from './tool-error.js';
import type { ToolParameters, ToolProperty } from './tool-schema.js';
import type { FileToolName } from './tool-types.js';

/** A file tool before it is bound to a sandbox: its schema and how to run it. */
export interface FileToolSpec {
  name: FileToolName;
  description: string;
  parameters: ToolParameters;
  run(sandbox: BaseSandbox, args: Record<string, unknown>): Promise<unknown>;
}

const str = (description: string): ToolProperty => ({ type: 'string', description });

function schema(properties: Record<string, ToolProperty>, required: string[]): ToolParameters {
  return { type: 'object', properties, required, additionalProperties: false };
}

/** File tools report a failed operation as `error` in their result; a tool call fails with it. */
function orFail<T extends { error?: string }>(tool: string, result: T): Omit<T, 'error'> {
  if (result.error !== undefined) throw new ToolCallError(tool, 'FileOperationError', result.error);
  const { error: _, ...rest } = result;
  return rest;
}

const PATH_NOTE = 'Relative paths start at the working directory; results carry absolute paths.';

/** The file tools of every {@link BaseSandbox}, with hand-written schemas (snake_case, as models expect). */
export const FILE_TOOLS: readonly FileToolSpec[] = [
  {
    name: 'ls',
    description: `List the entries of a directory (one level, hidden ones included). ${PATH_NOTE}`,
    parameters: schema({ path: { ...str('Directory to list'), default: '.' } }, []),
    run: async (box, a) => orFail('ls', await box.ls((a.path as string | undefined) ?? '.')),
  },
  {
    name: 'read_file',
    description:
      'Read a page of a text file: lines offset (0-based) to offset + limit, without line numbers. ' +
      'nextOffset is the offset of the next page (null at the end). Media and non-UTF-8 files come back whole as base64.',
    parameters: schema(
      {
        file_path: str('File to read'),
        offset: { type: 'integer', minimum: 0, default: 0, description: 'First line, 0-based' },
        limit: { type: 'integer', minimum: 1, default: 2000, description: 'Lines to read' },
      },
      ['file_path'],
    ),
    run: async (box, a) => {
      const page = orFail(
        'read_file',
        await box.read(a.file_path as string, {
          ...(a.offset === undefined ? {} : { offset: a.offset as number }),
          ...(a.limit === undefined ? {} : { limit: a.limit as number }),
        }),
      );
      const { fileData, ...rest } = page;
      return { ...fileData, ...rest };
    },
  },
  {
    name: 'write_file',
    description:
      'Create or overwrite a text file with exactly `content`, creating parent directories.',
    parameters: schema(
      { file_path: str('File to write'), content: str('The whole new content (UTF-8)') },
      ['file_path', 'content'],
    ),
    run: async (box, a) =>
      orFail('write_file', await box.write(a.file_path as string, a.content as string)),
  },
  {
    name: 'edit_file',
    description:
      'Replace old_string with new_string in a file. old_string must occur exactly once unless replace_all; otherwise nothing changes.',
    parameters: schema(
      {
        file_path: str('File to edit'),
        old_string: str('Exact text to replace'),
        new_string: str('Replacement text'),
        replace_all: { type: 'boolean', default: false, description: 'Replace every occurrence' },
      },
      ['file_path', 'old_string', 'new_string'],
    ),
    run: async (box, a) =>
      orFail(
        'edit_file',
        await box.edit(a.file_path as string, a.old_string as string, a.new_string as string, {
          replaceAll: (a.replace_all as boolean | undefined) ?? false,
        }),
      ),
  },
  {
    name: 'glob',
    description:
      'Find regular files matching a glob (*, ?, **, [!x], {a,b}). A pattern without / matches base names at any depth, hidden folders included; with /, wildcards skip names starting with a dot unless the pattern spells the dot. ' +
      PATH_NOTE,
    parameters: schema(
      {
        pattern: str('Glob pattern, e.g. **/*.ts'),
        path: str('Directory the pattern is relative to'),
      },
      ['pattern'],
    ),
    run: async (box, a) =>
      orFail(
        'glob',
        await box.glob(a.pattern as string, a.path === undefined ? {} : { path: a.path as string }),
      ),
  },
  {
    name: 'grep',
    description: `Find lines containing a literal text (not a regex) in a file or under a directory. ${PATH_NOTE}`,
    parameters: schema(
      {
        pattern: str('Literal, case-sensitive text to find'),
        path: str('File or directory to search; default the working directory'),
        glob: str('Only search files matching this glob, e.g. *.py'),
        max_count: { type: 'integer', minimum: 1, description: 'At most this many matches' },
      },
      ['pattern'],
    ),
    run: async (box, a) =>
      orFail(
        'grep',
        await box.grep(a.pattern as string, {
          ...(a.path === undefined ? {} : { path: a.path as string }),
          ...(a.glob === undefined ? {} : { glob: a.glob as string }),
          ...(a.max_count === undefined ? {} : { maxCount: a.max_count as number }),
        }),
      ),
  },
  {
    name: 'execute',
    description:
      'Run a shell command (/bin/sh -c) in the sandbox and wait for it. Gives stdout and stderr combined and the exit code; a non-zero exit is a result, not a failure.',
    parameters: schema(
      {
        command: str('The shell command'),
        timeout_ms: {
          type: 'integer',
          minimum: 1,
          description: 'Kill the command after this long',
        },
      },
      ['command'],
    ),
    run: (box, a) =>
      box.execute(
        a.command as string,
        a.timeout_ms === undefined ? {} : { timeoutMs: a.timeout_ms as number },
      ),
  },
];
