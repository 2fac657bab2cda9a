import { Readable } from 'node:stream';
import { execLine } from '../protocol/shell-words.js';
import { OUTPUT_ENCODINGS, type OutputEncoding, type StreamOffsets } from '../protocol/wire.js';
import { posixShell } from '../server/child-process.js';
import { BadRequestError } from '../server/errors.js';
import { safePath } from '../server/file-system.js';
import { Reply } from '../server/http.js';
import { ProcessTable, processInfo } from '../server/process-table.js';
import { defineGroup } from '../server/route-group.js';
import { identityFor } from '../server/users.js';
import { argList, envOf } from '../server/validate.js';
import { processEvents } from './process-events.js';
import { logOutput } from './sandbox-log.js';

const NDJSON = {
  'content-type': 'application/x-ndjson; charset=utf-8',
  'cache-control': 'no-store',
};

/** An NDJSON answer: `first` (if any), then the lines of `events`. */
export function ndjson(events: AsyncIterable<string>, first?: unknown): Reply {
  return new Reply(
    200,
    Readable.from(
      (async function* () {
        if (first !== undefined) yield `${JSON.stringify(first)}\n`;
        yield* events;
      })(),
    ),
    NDJSON,
  );
}

const OUTPUT_ARG = [
  'str',
  'text',
  'how output events carry bytes: text (UTF-8, U+FFFD for what is not) or base64 (the raw bytes)',
] as const;

function outputOf(value: unknown): OutputEncoding {
  if (!OUTPUT_ENCODINGS.includes(value as OutputEncoding)) {
    throw new BadRequestError(
      `output must be ${OUTPUT_ENCODINGS.map((o) => JSON.stringify(o)).join(' or ')}, not ${JSON.stringify(value)}`,
    );
  }
  return value as OutputEncoding;
}

/**
 * What `POST /exec` runs: `/bin/sh -c cmd`, or an argv's program itself (one exec fewer: the
 * shell's start costs milliseconds in a sandbox). The listing shows an argv as the shell line that
 * runs the same ({@link execLine}).
 */
function programOf(cmd: unknown, argv: unknown): [string, string[], string] {
  if ((cmd === undefined) === (argv === undefined)) {
    throw new BadRequestError(
      'give cmd (a shell command line) or argv (a program and its arguments), exactly one of them',
    );
  }
  if (typeof cmd === 'string') return [posixShell(), ['-c', cmd], cmd];
  const words = argv as string[];
  return [words[0] as string, words.slice(1), execLine(words)];
}

function offsetOf(value: unknown, name: string): number {
  const offset = value as number;
  if (offset < 0) throw new BadRequestError(`${name} must not be negative`);
  return offset;
}

/**
 * envd's processes for the SDK: stdout and stderr kept apart and followed as NDJSON events,
 * resumable from per-stream offsets, with a timeout that kills the process group. The processes
 * live in the same table as the PROCESS group's, so `/process/{id}/stdin`, `/kill` and `GET
 * /process` reach them too.
 */
export const EXEC = defineGroup('EXEC', '/exec', 'processes with separate stdout and stderr', [
  {
    method: 'POST',
    path: '/exec',
    summary:
      'Starts a shell command (or a program, `argv`) in its own process group and streams NDJSON: a `start` event, its output, `exit`.',
    args: argList({
      'cmd?': ['str', undefined, 'shell command line, run with /bin/sh -c'],
      'argv?': [
        'argv',
        undefined,
        'instead of cmd: a program and its arguments, run as they are without a shell',
      ],
      'cwd?': ['str', '.', 'working directory'],
      'env?': ['env', undefined, 'extra environment: KEY=VALUE lines or a JSON object of strings'],
      'timeout?': ['float', 0, 'seconds before the process group is killed; 0: no limit'],
      'stdin?': ['bool', true, 'keep stdin open for /process/{id}/stdin; false: closed at once'],
      'user?': ['str', undefined, 'run as this user (only where envd runs as root)'],
      'output?': [...OUTPUT_ARG],
      'log?': [
        'bool',
        false,
        "also write its output to the sandbox's log (a template's start command): stdout info, stderr error",
      ],
    }),
    handler: async ({ args, ctx, closed }) => {
      const seconds = args.timeout as number;
      if (seconds < 0) throw new BadRequestError('timeout must not be negative (0: no limit)');
      const output = outputOf(args.output);
      const [file, words, command] = programOf(args.cmd, args.argv);
      const entry = await ctx.processes.start(file, words, {
        command,
        cwd: safePath(args.cwd as string, 'cwd'),
        env: envOf(args.env),
        ...(args.user === undefined ? {} : { identity: identityFor(args.user as string) }),
        timeoutMs: Math.round(seconds * 1000),
      });
      if (!args.stdin) entry.child.stdin?.end();
      if (args.log) logOutput(entry.child);
      const from: StreamOffsets = { stdout: 0, stderr: 0 };
      return ndjson(processEvents(entry, from, { follow: true, closed, output }), {
        start: processInfo(entry),
      });
    },
  },
  {
    method: 'POST',
    path: '/exec/warmup',
    summary:
      'Runs `true` exactly as `POST /exec` would, without listing it: warms a fresh envd before its first real command.',
    // The daemon calls it on a sandbox it puts in its warm pool: a fresh Node process runs each
    // function of the exec path (HTTP parsing, routing, spawn, the event stream) for the first
    // time, slowly, and the sandbox's first real command would otherwise pay for it. The process
    // lives in a table of its own, so `GET /process` and the ids of later processes never see it.
    handler: async ({ closed }) => {
      const entry = await new ProcessTable('warmup').start(posixShell(), ['-c', 'true'], {
        command: 'true',
        cwd: safePath('.', 'cwd'),
        env: envOf(undefined),
        timeoutMs: 10_000,
      });
      entry.child.stdin?.end();
      return ndjson(processEvents(entry, { stdout: 0, stderr: 0 }, { follow: true, closed }), {
        start: processInfo(entry),
      });
    },
  },
  {
    method: 'GET',
    path: '/exec/{id}/events',
    summary:
      'Replays a process’s NDJSON events from per-stream byte offsets; with `follow` (default) until `exit`.',
    args: argList({
      'stdout_offset?': ['int', 0, 'stdout byte to start from'],
      'stderr_offset?': ['int', 0, 'stderr byte to start from'],
      'follow?': ['bool', true, 'keep streaming until the process exits'],
      'output?': [...OUTPUT_ARG],
    }),
    handler: ({ args, ctx, params, closed }) => {
      const output = outputOf(args.output);
      const entry = ctx.processes.get(params.id ?? '');
      const from: StreamOffsets = {
        stdout: offsetOf(args.stdout_offset, 'stdout_offset'),
        stderr: offsetOf(args.stderr_offset, 'stderr_offset'),
      };
      return ndjson(processEvents(entry, from, { follow: args.follow as boolean, closed, output }));
    },
  },
]);
