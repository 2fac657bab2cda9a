import { readFile } from 'node:fs/promises';
import { posixShell, runToCompletion } from './child-process.js';
import type { RegisteredCommand } from './command-table.js';
import { BadRequestError, fsError } from './errors.js';
import { safePath, writeAtomic } from './file-system.js';
import { identityFor } from './users.js';
import { argList, envOf } from './validate.js';

const ENCODINGS = ['utf-8', 'base64'];

function encodingOf(value: unknown): 'utf-8' | 'base64' | undefined {
  if (value === undefined || value === 'utf-8' || value === 'base64') return value;
  throw new BadRequestError(
    `encoding must be one of ${ENCODINGS.join(', ')}, not ${JSON.stringify(value)}`,
  );
}

/** The `content` of a file: UTF-8 text when the bytes are valid UTF-8, else base64. */
export function encodeContent(bytes: Buffer, wanted?: 'utf-8' | 'base64') {
  const encoding = wanted ?? (isUtf8(bytes) ? 'utf-8' : 'base64');
  if (encoding === 'utf-8' && !isUtf8(bytes)) {
    throw new BadRequestError('the file is not valid UTF-8; ask for encoding "base64"');
  }
  return {
    content: bytes.toString(encoding === 'utf-8' ? 'utf8' : 'base64'),
    encoding,
    size: bytes.length,
  };
}

function isUtf8(bytes: Buffer): boolean {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    return true;
  } catch {
    return false;
  }
}

/** Default seconds a `runshell` may run. */
export const RUNSHELL_DEFAULT_TIMEOUT_S = 60;

/**
 * Runs `cmd` with `/bin/sh -c` in its own process group; the result has its output and exit code.
 * Shared by `runshell` and `POST /process/exec`.
 */
export function runShell(kwargs: Record<string, unknown>) {
  const seconds = kwargs.timeout as number;
  if (seconds <= 0) throw new BadRequestError('timeout must be a positive number of seconds');
  const identity = identityFor(kwargs.user as string | undefined);
  return runToCompletion(posixShell(), ['-c', kwargs.cmd as string], {
    cwd: kwargs.cwd === undefined ? undefined : safePath(kwargs.cwd as string, 'cwd'),
    env: envOf(kwargs.env),
    ...(identity ? { identity } : {}),
    timeoutMs: Math.round(seconds * 1000),
    what: `shell command ${JSON.stringify(kwargs.cmd)}`,
  });
}

/** Arguments of `runshell` and `POST /process/exec`. */
export const SHELL_ARGS = argList({
  cmd: ['str', undefined, 'shell command line, run with /bin/sh -c'],
  'cwd?': ['str', undefined, 'working directory'],
  'timeout?': ['float', RUNSHELL_DEFAULT_TIMEOUT_S, 'seconds before the process group is killed'],
  'env?': ['env', undefined, 'extra environment: KEY=VALUE lines or a JSON object of strings'],
});

/**
 * `POST /process/exec`'s: runshell's and `user`, honoured only where the server runs as root
 * (envd in an image build's sandbox). runshell keeps the command contract's arguments.
 */
export const EXEC_ARGS = [
  ...SHELL_ARGS,
  ...argList({
    'user?': ['str', undefined, 'run as this user (only where the server runs as root)'],
  }),
];

/** `upload`, `download` and `runshell`: served by every server, listed in `GET /commands`. */
export function builtinCommands(): RegisteredCommand[] {
  return [
    {
      name: 'upload',
      description: 'Writes a file atomically (temp file + rename), creating parent directories.',
      args: argList({
        path: ['str', undefined, 'file to write'],
        content: ['str', undefined, 'the bytes, as text or base64'],
        'encoding?': ['str', 'utf-8', 'utf-8 or base64'],
      }),
      handler: async ({ path, content, encoding }) => {
        const bytes = Buffer.from(
          content as string,
          encodingOf(encoding) === 'base64' ? 'base64' : 'utf8',
        );
        const target = safePath(path as string);
        return { path: target, size: await writeAtomic(target, bytes) };
      },
    },
    {
      name: 'download',
      description: 'Reads a file: UTF-8 text, or base64 when the bytes are not valid UTF-8.',
      args: argList({
        path: ['str', undefined, 'file to read'],
        'encoding?': ['str', undefined, 'force utf-8 or base64'],
      }),
      handler: async ({ path, encoding }) => {
        const target = safePath(path as string);
        const bytes = await readFile(target).catch((error) => {
          throw fsError(error, `read ${target}`);
        });
        return encodeContent(bytes, encodingOf(encoding));
      },
    },
    {
      name: 'runshell',
      description: 'Runs a shell command and returns its stdout, stderr and exit code.',
      args: SHELL_ARGS,
      // runshell enforces its own `timeout` argument and kills the process group.
      timeoutMs: 0,
      handler: runShell,
    },
  ];
}
