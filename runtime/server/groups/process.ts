import { constants } from 'node:os';
import { Readable } from 'node:stream';
import { EXEC_ARGS, runShell } from '../builtins.js';
import { posixShell } from '../child-process.js';
import { BadRequestError } from '../errors.js';
import { safePath } from '../file-system.js';
import { Reply } from '../http.js';
import type { OutputLog } from '../output-log.js';
import { processInfo } from '../process-table.js';
import { defineGroup } from '../route-group.js';
import { argList, envOf } from '../validate.js';

/** A follow stream re-checks the client at least this often while a process is silent. */
const FOLLOW_POLL_MS = 15_000;

/** Validates a signal name such as `SIGTERM` or `TERM`. */
export function signalOf(name: unknown): NodeJS.Signals {
  const upper = String(name).toUpperCase();
  const full = (upper.startsWith('SIG') ? upper : `SIG${upper}`) as NodeJS.Signals;
  if (!(full in constants.signals)) {
    throw new BadRequestError(
      `unknown signal ${JSON.stringify(name)}; use a name such as SIGTERM or SIGKILL`,
    );
  }
  return full;
}

/** Streams a log from `offset` until it closes or the client goes away. */
export function follow(log: OutputLog, offset: number, closed: AbortSignal): Readable {
  return Readable.from(
    (async function* () {
      let at = offset;
      while (!closed.aborted) {
        const { data, next } = log.read(at);
        if (data.length > 0) yield data;
        at = next;
        if (log.done && log.end <= at) return;
        await log.waitPast(at, FOLLOW_POLL_MS, closed);
      }
    })(),
  );
}

/** The JSON answer of an output read. */
export function outputFrom(log: OutputLog, offset: number) {
  const { data, offset: from, next } = log.read(offset);
  // A multi-byte character split at the end stays for the next read (whole), so text is never
  // garbled at chunk boundaries; a finished log gives what it has.
  const cut = log.done ? data.length : utf8Boundary(data);
  return {
    data: data.subarray(0, cut).toString('utf8'),
    offset: from,
    next_offset: next - (data.length - cut),
    done: log.done && cut === data.length,
  };
}

/** Length of the longest prefix of `data` that does not end inside a UTF-8 character. */
export function utf8Boundary(data: Buffer): number {
  // Look back over at most 3 continuation bytes for the lead byte of the last character.
  for (let back = 1; back <= Math.min(4, data.length); back++) {
    const byte = data[data.length - back] as number;
    if ((byte & 0xc0) === 0x80) continue;
    const size = byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : byte >= 0xc0 ? 2 : 1;
    return size > back ? data.length - back : data.length;
  }
  return data.length;
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** The bytes `data` stands for: UTF-8 text, or (for input that is not text) base64. */
function stdinBytes(data: string, encoding: unknown): Buffer {
  if (encoding === 'text') return Buffer.from(data, 'utf8');
  if (encoding !== 'base64') {
    throw new BadRequestError(
      `encoding must be "text" or "base64", not ${JSON.stringify(encoding)}`,
    );
  }
  if (!BASE64.test(data)) {
    throw new BadRequestError(
      'data is not base64 (A-Z a-z 0-9 + /, padded with = to a multiple of 4)',
    );
  }
  return Buffer.from(data, 'base64');
}

/** Shell commands: run to completion, or start in the background and manage by id. */
export const PROCESS = defineGroup('PROCESS', '/process', 'run and manage processes', [
  {
    method: 'POST',
    path: '/process/exec',
    summary:
      'Runs a shell command to completion (`timeout` s kills its process group → 504 with partial output).',
    args: EXEC_ARGS,
    handler: ({ args }) => runShell(args),
  },
  {
    method: 'POST',
    path: '/process/start',
    summary: 'Starts a shell command in the background in its own process group; answers its id.',
    args: argList({ cmd: 'str', 'cwd?': ['str', '.'], 'env?': 'env' }),
    handler: async ({ args, ctx }) => {
      const cmd = args.cmd as string;
      const cwd = safePath(args.cwd as string, 'cwd');
      const entry = await ctx.processes.start(posixShell(), ['-c', cmd], {
        command: cmd,
        cwd,
        env: envOf(args.env),
      });
      return processInfo(entry);
    },
  },
  {
    method: 'GET',
    path: '/process',
    summary: 'Every background process with its state.',
    handler: ({ ctx }) => ({ processes: ctx.processes.list().map(processInfo) }),
  },
  {
    method: 'GET',
    path: '/process/{id}',
    summary: 'State of one background process: running, exit code, signal, output size.',
    handler: ({ ctx, params }) => processInfo(ctx.processes.get(params.id ?? '')),
  },
  {
    method: 'POST',
    path: '/process/{id}/stdin',
    summary:
      'Writes `data` to the process input (base64 with `encoding: base64`); `eof` closes it.',
    args: argList({
      data: 'str',
      'eof?': ['bool', false],
      'encoding?': ['str', 'text', 'text (data is written as UTF-8) or base64 (data is bytes)'],
    }),
    handler: ({ ctx, params, args }) => {
      const bytes = stdinBytes(args.data as string, args.encoding);
      ctx.processes.write(params.id ?? '', bytes, args.eof as boolean);
      return { written: bytes.length };
    },
  },
  {
    method: 'POST',
    path: '/process/{id}/kill',
    summary: 'Sends a signal (default SIGKILL) to the whole process group.',
    args: argList({ 'signal?': ['str', 'SIGKILL'] }),
    handler: ({ ctx, params, args }) =>
      processInfo(ctx.processes.kill(params.id ?? '', signalOf(args.signal))),
  },
  {
    method: 'GET',
    path: '/process/{id}/output',
    summary:
      'Output from byte `offset` as JSON; with `follow=true` a raw stream until the process exits.',
    args: argList({ 'offset?': ['int', 0], 'follow?': ['bool', false] }),
    handler: ({ ctx, params, args, closed }) => {
      const { output } = ctx.processes.get(params.id ?? '');
      const offset = args.offset as number;
      if (offset < 0) throw new BadRequestError('offset must not be negative');
      return args.follow
        ? new Reply(200, follow(output, offset, closed))
        : outputFrom(output, offset);
    },
  },
]);
