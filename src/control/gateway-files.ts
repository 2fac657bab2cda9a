import { closeSync, ftruncate, write } from 'node:fs';
import type { Socket } from 'node:net';
import { fsError } from '../../runtime/server/errors.js';
import { PayloadTooLargeError, UpstreamError } from '../errors.js';
import { FileSink, readInto, type SandboxFiles } from '../providers/local/sandbox-files.js';
import type { RequestTarget, Route } from './gateway-connection.js';
import type { RequestHead } from './gateway-http.js';
import { LOCAL_FILE_HEADER, localFileUnavailable, openLocalFile } from './local-handoff.js';
import type { ConnectionEnds } from './peer-uid.js';

/**
 * Native file transfers the gateway serves itself (issue 49): `GET /files/read?path=` and
 * `PUT /files/write?path=` of a local sandbox go between the client's socket and the sandbox's
 * file with no hop through envd, when {@link SandboxFiles} can take the path (an absolute path of
 * directories and a regular file the sandbox's user may use, on its own disks). Everything else,
 * and every request with more than `?path=` (a range, metadata headers, `user`, root's envd),
 * goes to envd as before, so the contract is envd's: same statuses, answers and errors.
 */

/** Reads of a download: 1 MiB each, into one of 3 buffers the socket gives back once written. */
const READ_CHUNK_BYTES = 1024 * 1024;
const READ_SLOTS = 3;
/** envd's limit of a streamed upload (runtime/envd/main.ts): over it, a 413. */
export const DIRECT_UPLOAD_MAX_BYTES = 64 * 1024 ** 3;
/** A transfer checks that its sandbox still runs every this many bytes, and before it ends. */
const ALIVE_CHECK_BYTES = 16 * 1024 * 1024;

/** The error of a transfer whose sandbox was killed meanwhile (envd's connection would break). */
function sandboxEnded(path: string): UpstreamError {
  return new UpstreamError(
    `the sandbox was paused, forked or ended while ${path} was being transferred: nothing more of it is read or written; send the request again`,
  );
}

/** A download served from the sandbox's file: writes its answer to the client's socket. */
export interface DirectRead {
  kind: 'read';
  /** Writes the head and the file; resolves once all is written, rejects if it cannot be. */
  send(socket: Socket, close: boolean): Promise<void>;
  abort(): void;
}

/** An upload into the sandbox's file: takes the body as it comes, then renames it into place. */
export interface DirectWrite {
  kind: 'write';
  /** Takes body bytes; false: wait for {@link drained}. Throws a 413 past envd's limit. */
  data(chunk: Buffer): boolean;
  drained(): Promise<void>;
  /** The body is whole: the answer's bytes once the file is in place (rejects with envd's error). */
  end(close: boolean): Promise<string>;
  /** The body will not be whole (the client went, a deadline): the temporary file is removed. */
  abort(): void;
}

/**
 * A copy between a local client's file (`X-Abx-Local-File`, local-handoff.ts) and the sandbox's:
 * no body either way; the answer is JSON `{ path, size }`.
 */
export interface DirectHandoff {
  kind: 'handoff';
  /** Copies; resolves with the answer's bytes and the file's size (rejects with the error to answer). */
  run(close: boolean): Promise<{ answer: string; size: number }>;
  abort(): void;
}

export type DirectTransfer = DirectRead | DirectWrite | DirectHandoff;

/** Copies of a handoff: 4 MiB reads and writes, two buffers, one read ahead of the write. */
const HANDOFF_CHUNK_BYTES = 4 * 1024 * 1024;

/** Whether a request names a local client's file (it is then served by handoff or refused). */
export function namesLocalFile(head: RequestHead): boolean {
  return head.keys.includes(LOCAL_FILE_HEADER);
}

/** The only query a direct transfer takes: `path=` once, absolute. */
function pathOnly(target: RequestTarget): string | undefined {
  const mark = target.path.indexOf('?');
  if (mark < 0) return undefined;
  const params = new URLSearchParams(target.path.slice(mark + 1));
  const keys = [...params.keys()];
  if (keys.length !== 1 || keys[0] !== 'path') return undefined;
  const path = params.get('path') as string;
  return path.startsWith('/') ? path : undefined;
}

/** A request the gateway may serve itself: what it does, on which path, for a browser or not. */
export interface DirectCandidate {
  kind: 'read' | 'write';
  path: string;
  cors: boolean;
  /** `X-Abx-Local-File`'s value: the bytes go between that file of the client and the path. */
  local?: string;
}

/** envd's headers for a request with an Origin: any origin may read the answer (no cookie). */
const CORS_LINES = ['access-control-allow-origin: *', 'access-control-expose-headers: *'];

/** Whether a request might be served directly, from its head alone (no file looked at yet). */
export function directCandidate(
  head: RequestHead,
  target: RequestTarget,
  route: Route,
): DirectCandidate | undefined {
  if (!route.envd || target.root || target.e2b || head.upgrade) return undefined;
  // A browser's request (the dashboard, E2B's SDK in a page) reads the answer only with the
  // headers envd gives every request with an Origin (runtime/server/server.ts).
  const cors = head.keys.includes('origin');
  const at = head.keys.indexOf(LOCAL_FILE_HEADER);
  if (at >= 0) {
    // A browser's request never names a local file: a page (one a sandbox serves, say) would name
    // the browser's own open files (its cookie store) as the browser's process holds them.
    if (cors || head.keys.some((key) => key.startsWith('sec-fetch-'))) {
      throw localFileUnavailable(
        "a browser's request (Origin, Sec-Fetch-*) never names a local file",
      );
    }
    // A handoff: no body, nothing but `?path=`, no metadata (envd's to keep).
    if (head.bodyLength !== 0 || head.keys.some((key) => key.startsWith('x-metadata-'))) {
      return undefined;
    }
    const path = pathOnly(target);
    const local = head.values[at] as string;
    if (path === undefined) return undefined;
    if (head.method === 'GET' && target.pathname === '/files/read') {
      return { kind: 'read', path, cors, local };
    }
    if (head.method === 'PUT' && target.pathname === '/files/write') {
      return { kind: 'write', path, cors, local };
    }
    return undefined;
  }
  if (head.method === 'GET' && target.pathname === '/files/read' && head.bodyLength === 0) {
    const path = pathOnly(target);
    return path === undefined ? undefined : { kind: 'read', path, cors };
  }
  if (head.method === 'PUT' && target.pathname === '/files/write' && head.bodyLength !== 0) {
    // Metadata is envd's to keep; `Expect: 100-continue` waits for envd's interim answer.
    if (head.keys.some((key) => key.startsWith('x-metadata-') || key === 'expect')) {
      return undefined;
    }
    if (head.bodyLength > DIRECT_UPLOAD_MAX_BYTES) return undefined;
    const path = pathOnly(target);
    return path === undefined ? undefined : { kind: 'write', path, cors };
  }
  return undefined;
}

function answerHead(status: string, lines: string[], close: boolean, cors: boolean): string {
  const all = cors ? [...lines, ...CORS_LINES] : lines;
  return `HTTP/1.1 ${status}\r\n${all.join('\r\n')}\r\ndate: ${new Date().toUTCString()}\r\n${close ? 'connection: close\r\n' : ''}\r\n`;
}

/**
 * The direct transfer of a candidate, or undefined when envd must answer it. A handoff whose
 * sandbox file the gateway cannot take, or whose client file fails a check, throws
 * {@link localFileUnavailable}: it never goes to envd (which would take its empty body).
 */
export function directTransfer(
  files: SandboxFiles,
  candidate: DirectCandidate,
  ends: ConnectionEnds,
): DirectTransfer | undefined {
  if (candidate.local !== undefined) return handoff(files, candidate, candidate.local, ends);
  return candidate.kind === 'read'
    ? directRead(files, candidate.path, candidate.cors)
    : directWrite(files, candidate.path, candidate.cors);
}

function jsonAnswer(value: unknown, close: boolean, cors: boolean): string {
  const body = JSON.stringify(value);
  return `${answerHead('200 OK', ['content-type: application/json; charset=utf-8', `content-length: ${Buffer.byteLength(body)}`], close, cors)}${body}`;
}

function writeAt(fd: number, buffer: Buffer, length: number, position: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const next = (offset: number) => {
      if (offset >= length) return resolve();
      write(fd, buffer, offset, length - offset, position + offset, (error, written) => {
        if (error) reject(error);
        else next(offset + written);
      });
    };
    next(0);
  });
}

/**
 * Copies `size` bytes (or, when undefined, until the source ends) from `from` to `to`, 4 MiB at
 * a time with the next read under way while one is written; `check` runs between chunks (a fence,
 * a killed sandbox). Resolves with the bytes copied.
 */
async function copyFd(
  from: number,
  to: number,
  size: number | undefined,
  check: (copied: number) => void,
): Promise<number> {
  const buffers = [
    Buffer.allocUnsafeSlow(HANDOFF_CHUNK_BYTES),
    Buffer.allocUnsafeSlow(HANDOFF_CHUNK_BYTES),
  ];
  let position = 0;
  let turn = 0;
  const want = () =>
    size === undefined ? HANDOFF_CHUNK_BYTES : Math.min(HANDOFF_CHUNK_BYTES, size - position);
  let reading = want() > 0 ? readInto(from, buffers[0] as Buffer, want(), 0) : Promise.resolve(0);
  for (;;) {
    const bytes = await reading;
    if (bytes === 0) break;
    const buffer = buffers[turn] as Buffer;
    const at = position;
    position += bytes;
    turn = 1 - turn;
    const more = want();
    reading =
      more > 0 ? readInto(from, buffers[turn] as Buffer, more, position) : Promise.resolve(0);
    // The read ahead must settle before a failed write leaves: nothing reads a closed descriptor.
    await writeAt(to, buffer, bytes, at).catch(async (error) => {
      await reading.catch(() => undefined);
      throw error;
    });
    check(position);
  }
  return position;
}

function handoff(
  files: SandboxFiles,
  candidate: DirectCandidate,
  local: string,
  ends: ConnectionEnds,
): DirectHandoff {
  const { path, cors } = candidate;
  let stopped = false;
  const stop = () => {
    stopped = true;
  };
  const check = () => {
    if (stopped || !files.alive()) throw sandboxEnded(path);
  };
  // The client's file is checked first: a refusal touches nothing of the sandbox's.
  if (candidate.kind === 'read') {
    const client = openLocalFile(ends, local, 'write');
    const file = files.openRead(path, stop);
    if (!file) {
      closeSync(client);
      throw localFileUnavailable(`the gateway cannot read ${path} itself (envd must)`);
    }
    return {
      kind: 'handoff',
      async run(close) {
        try {
          const size = await copyFd(file.fd, client, file.size, check);
          if (size !== file.size) throw new Error(`${path} became shorter while it was read`);
          await new Promise<void>((resolve, reject) =>
            ftruncate(client, size, (error) => (error ? reject(error) : resolve())),
          );
          check();
          return { answer: jsonAnswer({ path, size }, close, cors), size };
        } catch (error) {
          throw error instanceof UpstreamError ? error : fsError(error, `read ${path}`);
        } finally {
          file.close();
          closeSync(client);
        }
      },
      abort: stop,
    };
  }
  const source = openLocalFile(ends, local, 'read');
  const file = files.createWrite(path, stop);
  if (!file) {
    closeSync(source);
    throw localFileUnavailable(`the gateway cannot write ${path} itself (envd must)`);
  }
  return {
    kind: 'handoff',
    async run(close) {
      let size: number;
      try {
        size = await copyFd(source, file.fd, undefined, (copied) => {
          if (copied > DIRECT_UPLOAD_MAX_BYTES) {
            throw new PayloadTooLargeError(
              `the client's file is over ${DIRECT_UPLOAD_MAX_BYTES} bytes, the most an upload may send`,
            );
          }
          check();
        });
        check();
      } catch (error) {
        closeSync(source);
        file.discard();
        throw error instanceof UpstreamError || error instanceof PayloadTooLargeError
          ? error
          : fsError(error, `write ${file.path}`);
      }
      closeSync(source);
      try {
        // The commit cleans up after itself when its rename fails.
        file.commit();
      } catch (error) {
        throw fsError(error, `write ${file.path}`);
      }
      return { answer: jsonAnswer({ path: file.path, size }, close, cors), size };
    },
    abort: stop,
  };
}

function directRead(files: SandboxFiles, path: string, cors: boolean): DirectRead | undefined {
  let stopped = false;
  /** Wakes the send loop where it waits for a buffer (a fence's stop must not wait for the client). */
  let wakeUp: (() => void) | undefined;
  const file = files.openRead(path, () => {
    stopped = true;
    wakeUp?.();
  });
  if (!file) return undefined;
  return {
    kind: 'read',
    async send(socket, close) {
      // A few buffers, each filled again once the socket has taken it: no fresh buffer per read,
      // which in the daemon's large heap cost more in collections than the copies themselves.
      const slots = Math.max(1, Math.min(READ_SLOTS, Math.ceil(file.size / READ_CHUNK_BYTES)));
      const free: Buffer[] = [];
      for (let i = 0; i < slots; i++) free.push(Buffer.allocUnsafeSlow(READ_CHUNK_BYTES));
      let wake: (() => void) | undefined;
      wakeUp = () => wake?.();
      const release = (buffer: Buffer) => {
        free.push(buffer);
        wake?.();
      };
      const gone = () => wake?.();
      socket.on('close', gone);
      try {
        const { size } = file;
        socket.write(
          answerHead(
            '200 OK',
            ['content-type: application/octet-stream', `content-length: ${size}`],
            close,
            cors,
          ),
          'latin1',
        );
        let position = 0;
        while (position < size) {
          while (free.length === 0 && !socket.destroyed && !stopped) {
            await new Promise<void>((resolve) => {
              wake = resolve;
            });
            wake = undefined;
          }
          if (stopped || socket.destroyed) throw new Error('the client went away');
          const buffer = free.pop() as Buffer;
          const length = Math.min(READ_CHUNK_BYTES, size - position);
          const bytes = await readInto(file.fd, buffer, length, position);
          if (stopped || socket.destroyed) throw new Error('the client went away');
          // Shorter than announced (the sandbox cut the file meanwhile): the client must see a cut
          // body, never a whole one of the wrong length.
          if (bytes === 0) throw new Error(`${path} became shorter while it was read`);
          // A killed sandbox's download is cut, as envd's would be.
          if (
            Math.floor((position + bytes) / ALIVE_CHECK_BYTES) >
            Math.floor(position / ALIVE_CHECK_BYTES)
          ) {
            if (!files.alive()) throw sandboxEnded(path);
          }
          position += bytes;
          socket.write(bytes === buffer.length ? buffer : buffer.subarray(0, bytes), () =>
            release(buffer),
          );
        }
      } finally {
        socket.off('close', gone);
        file.close();
      }
    },
    abort() {
      stopped = true;
    },
  };
}

function directWrite(files: SandboxFiles, path: string, cors: boolean): DirectWrite | undefined {
  let done = false;
  let stop = () => {};
  const file = files.createWrite(path, () => stop());
  if (!file) return undefined;
  const sink = new FileSink(file.fd);
  // envd's own wording and classes of fs errors (ENOSPC, EISDIR...), as envd's write answers.
  const fail = (error: unknown) => fsError(error, `write ${file.path}`);
  const abort = () => {
    if (done) return;
    done = true;
    void sink.settle().then(() => file.discard());
  };
  stop = abort;
  return {
    kind: 'write',
    data(chunk) {
      // Stopped (a fence: the sandbox is being frozen or ended): its file is gone, and no byte
      // may reach the descriptor it had.
      if (done) throw sandboxEnded(file.path);
      if (sink.size + chunk.length > DIRECT_UPLOAD_MAX_BYTES) {
        throw new PayloadTooLargeError(
          `the request body is over ${DIRECT_UPLOAD_MAX_BYTES} bytes, the most a streamed upload may send`,
        );
      }
      const before = sink.size;
      const more = sink.push(chunk);
      // A killed sandbox takes no more of an upload: the client gets an error, not a 200 for a
      // file on a disk nobody will see again.
      if (
        Math.floor(sink.size / ALIVE_CHECK_BYTES) > Math.floor(before / ALIVE_CHECK_BYTES) &&
        !files.alive()
      ) {
        throw sandboxEnded(file.path);
      }
      return more;
    },
    drained: () => sink.drained(),
    async end(close) {
      let size: number;
      try {
        size = await sink.finish();
        if (done) throw new Error('the upload was cut short');
        if (!files.alive()) throw sandboxEnded(file.path);
        // From here the temporary file is the commit's (it removes it if the rename fails).
        done = true;
        file.commit();
      } catch (error) {
        if (!done) file.discard();
        done = true;
        throw fail(error);
      }
      const body = JSON.stringify({ path: file.path, size });
      return `${answerHead('200 OK', ['content-type: application/json; charset=utf-8', `content-length: ${Buffer.byteLength(body)}`], close, cors)}${body}`;
    },
    abort,
  };
}
