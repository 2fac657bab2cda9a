import { basename } from 'node:path/posix';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import {
  MetadataError,
  metadataFromHeaders,
  metadataHeaders,
} from '../../../runtime/protocol/file-metadata.js';
import { SMALL_FILE_BYTES } from '../../../runtime/server/file-system.js';
import {
  type EnvdResponse,
  type EnvdTarget,
  envdRequest,
  envdStream,
  readText,
} from './envd-client.js';
import { boundaryOf, MultipartError, readMultipart } from './multipart.js';
import { E2B_USER } from './process-service.js';

/** An answer of E2B's `/files`: its status, headers and body pieces. */
export interface FilesAnswer {
  status: number;
  headers: Headers;
  body: AsyncIterable<Uint8Array>;
}

async function* once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  if (bytes.length > 0) yield bytes;
}

/** E2B's REST error body: `{ "code": <status>, "message" }`. */
export function filesError(status: number, message: string): FilesAnswer {
  return {
    status,
    headers: new Headers({ 'content-type': 'application/json' }),
    body: once(Buffer.from(JSON.stringify({ code: status, message }))),
  };
}

/** envd's error answer (`{error, type}`) in E2B's shape, with envd's status and message. */
async function fromEnvd(status: number, text: string, what: string): Promise<FilesAnswer> {
  let message = text.slice(0, 500);
  try {
    const body = JSON.parse(text) as { error?: unknown };
    if (typeof body.error === 'string') message = body.error;
  } catch {
    // not JSON: the text itself
  }
  return filesError(status >= 400 && status < 600 ? status : 502, `${what}: ${message}`);
}

/** The user of `?username=`: abx runs everything as its one user, never root. */
function userRefusal(query: URLSearchParams): FilesAnswer | undefined {
  const user = query.get('username');
  if (user === null || user === '' || user === E2B_USER) return undefined;
  return filesError(
    403,
    user === 'root'
      ? `username 'root' is refused: abx never gives a sandbox's processes or files root (they are its unprivileged user '${E2B_USER}'); leave it out or use '${E2B_USER}'`
      : `username ${JSON.stringify(user.slice(0, 64))} is refused: an abx sandbox has one user, '${E2B_USER}'; leave it out or use '${E2B_USER}'`,
  );
}

/** `GET /files?path=`: the file's bytes, streamed from envd's `GET /files/read`. */
export async function readFile(
  target: EnvdTarget,
  query: URLSearchParams,
  signal: AbortSignal,
): Promise<FilesAnswer> {
  const refused = userRefusal(query);
  if (refused) return refused;
  const path = query.get('path');
  if (!path) return filesError(400, 'GET /files needs ?path= naming the file to read');
  const res = await envdRequest(
    target,
    'GET',
    `/files/read?path=${encodeURIComponent(path)}`,
    undefined,
    signal,
  );
  const status = res.statusCode ?? 502;
  if (status !== 200) return fromEnvd(status, await readText(res), `read ${path}`);
  return {
    status: 200,
    headers: new Headers({ 'content-type': 'application/octet-stream' }),
    body: res,
  };
}

/** An upload that cannot be written as sent: its status and message (E2B's `{code, message}`). */
class UploadRefused extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = 'UploadRefused';
  }
}

/**
 * The body unpacked as it arrives (zlib's streaming gunzip). Nothing bounds what it expands to:
 * it is written to the sandbox's disk as it comes, so the disk's quota is the bound (envd's write
 * then fails with ENOSPC, answered as 507).
 */
async function* gunzipped(body: AsyncIterable<Uint8Array>): AsyncGenerator<Buffer> {
  const gunzip = createGunzip();
  let bodyError: unknown;
  const feeding = pipeline(async function* () {
    try {
      for await (const chunk of body) yield chunk;
    } catch (error) {
      bodyError = error;
      throw error;
    }
  }, gunzip).catch(() => undefined);
  try {
    for await (const chunk of gunzip) yield chunk as Buffer;
  } catch (error) {
    if (bodyError !== undefined) throw bodyError;
    throw new UploadRefused(
      400,
      `the gzip body could not be read: ${(error as Error).message}; send the file gzip-compressed whole, or without Content-Encoding`,
    );
  } finally {
    // Not awaited: the body's source may wait for the client's next bytes, which the gateway
    // drops once the face has answered.
    gunzip.destroy();
    void feeding;
  }
}

/** envd's error codes for a full disk: E2B's envd answers them 507 (the SDK's NotEnoughSpaceError). */
const DISK_FULL = new Set(['ENOSPC', 'EDQUOT']);

/**
 * The first bytes of `data`, up to `limit`: the whole of it when it ends within the limit, else
 * the same bytes as a stream that goes on with the rest. An error of `data` is thrown as it is.
 */
async function readUpTo(
  data: AsyncIterable<Uint8Array>,
  limit: number,
): Promise<
  { whole: Buffer; rest?: undefined } | { whole?: undefined; rest: AsyncIterable<Uint8Array> }
> {
  const iterator = data[Symbol.asyncIterator]();
  const read: Uint8Array[] = [];
  let bytes = 0;
  for (;;) {
    const item = await iterator.next();
    if (item.done) return { whole: Buffer.concat(read, bytes) };
    read.push(item.value);
    bytes += item.value.length;
    if (bytes > limit) break;
  }
  return {
    rest: (async function* () {
      yield* read;
      read.length = 0;
      for (let item = await iterator.next(); !item.done; item = await iterator.next()) {
        yield item.value;
      }
    })(),
  };
}

/**
 * One file streamed into envd's `PUT /files/write` (atomic: a write that does not complete leaves
 * no file). A `data` that throws (the client went away, the form broke) aborts the write and is
 * rethrown; envd's refusal is a {@link FilesAnswer} in E2B's shape.
 */
async function putFile(
  target: EnvdTarget,
  path: string,
  data: AsyncIterable<Uint8Array>,
  metadata: Record<string, string>,
  signal: AbortSignal,
): Promise<Written | FilesAnswer> {
  // A small file (most uploads: a script, a config) is read whole first and sent with its
  // length in one write: envd then writes it at once, without the thread pool, where a streamed
  // body costs it a millisecond more. A larger one is streamed from its first bytes on.
  const head = await readUpTo(data, SMALL_FILE_BYTES);
  let call: { res: EnvdResponse | Awaited<ReturnType<typeof envdStream>>['res']; cancel(): void };
  if (head.whole) {
    const res = await envdRequest(
      target,
      'PUT',
      `/files/write?path=${encodeURIComponent(path)}`,
      head.whole,
      signal,
      metadataHeaders(metadata),
    );
    call = { res, cancel: () => res.destroy() };
  } else {
    let dataError: unknown;
    const rest = head.rest;
    const tapped = (async function* () {
      try {
        for await (const chunk of rest) yield chunk;
      } catch (error) {
        dataError = error;
        throw error;
      }
    })();
    try {
      call = await envdStream(
        target,
        'PUT',
        `/files/write?path=${encodeURIComponent(path)}`,
        tapped,
        signal,
        metadataHeaders(metadata),
      );
    } catch (error) {
      throw dataError ?? error;
    }
  }
  const { res } = call;
  const status = res.statusCode ?? 502;
  const ok = status >= 200 && status < 300;
  let text: string;
  try {
    text = await readText(res);
  } finally {
    // An early refusal (a full disk, a directory in the way) ends the upload: the rest of the
    // body is not sent on.
    if (!ok) call.cancel();
  }
  if (ok) return JSON.parse(text) as Written;
  let code: unknown;
  try {
    code = (JSON.parse(text) as { code?: unknown }).code;
  } catch {
    // not JSON
  }
  if (typeof code === 'string' && DISK_FULL.has(code)) {
    return fromEnvd(507, text, `write ${path}: the sandbox's disk is full`);
  }
  return fromEnvd(status, text, `write ${path}`);
}

/** envd's answer to a write: the metadata it keeps for the file when there is some. */
interface Written {
  path: string;
  metadata?: Record<string, string>;
}

function isAnswer(value: Written | FilesAnswer): value is FilesAnswer {
  return 'status' in value;
}

/**
 * `POST /files`: one file (octet-stream) or a form of one or more, each streamed into envd's write
 * as its bytes arrive (memory stays bounded whatever the size). Parts are written in turn, as
 * E2B's envd writes them: a form that turns out malformed keeps the files of the parts before the
 * break, and the part being written when it broke is not written (envd's write is atomic).
 */
export async function writeFiles(
  target: EnvdTarget,
  query: URLSearchParams,
  headers: Headers,
  raw: AsyncIterable<Uint8Array>,
  signal: AbortSignal,
): Promise<FilesAnswer> {
  const refused = userRefusal(query);
  if (refused) return refused;
  const encoding = (headers.get('content-encoding') ?? 'identity').trim().toLowerCase();
  if (encoding !== 'gzip' && encoding !== 'identity') {
    return filesError(
      415,
      `Content-Encoding ${JSON.stringify(encoding.slice(0, 40))}: send gzip or none`,
    );
  }
  // `X-Metadata-<key>: <value>`: every file of the upload gets the set (E2B's envd keeps it as
  // `user.e2b.*` xattrs; abx's envd keeps it itself). A bad set is refused before a byte is written.
  let metadata: Record<string, string>;
  try {
    metadata = metadataFromHeaders(headers.entries());
  } catch (error) {
    if (error instanceof MetadataError)
      return filesError(400, `invalid metadata: ${error.message}`);
    throw error;
  }
  const body = encoding === 'gzip' ? gunzipped(raw) : raw;
  const type = headers.get('content-type') ?? '';
  const path = query.get('path') || undefined;
  const written: {
    name: string;
    type: 'file';
    path: string;
    metadata?: Record<string, string>;
  }[] = [];
  /** The paths asked for and written, so that no two parts write one file. */
  const seen = new Set<string>();
  const done = (asked: string, result: Written) => {
    seen.add(asked).add(result.path);
    written.push({
      name: basename(result.path),
      type: 'file',
      path: result.path,
      // As E2B's envd: the metadata the file has now, left out when it has none.
      ...(result.metadata && Object.keys(result.metadata).length > 0
        ? { metadata: result.metadata }
        : {}),
    });
  };
  try {
    if (/^multipart\/form-data/i.test(type)) {
      const boundary = boundaryOf(type);
      for await (const part of readMultipart(body, boundary)) {
        if (part.name !== 'file') continue;
        // As E2B's envd: `?path=` names the file of every part, else the part's filename does.
        const file = path ?? part.filename;
        if (!file) {
          return filesError(
            400,
            'a file has no path: give ?path= or the full path as the part filename',
          );
        }
        if (seen.has(file)) {
          return filesError(
            400,
            `cannot upload multiple files to same path ${JSON.stringify(file.slice(0, 200))}: name each part's file by its filename and leave ?path= out`,
          );
        }
        const result = await putFile(target, file, part.data, metadata, signal);
        if (isAnswer(result)) return result;
        done(file, result);
      }
      if (written.length === 0) return filesError(400, 'the form has no `file` part');
    } else if (/^application\/octet-stream/i.test(type) || type === '') {
      if (!path) {
        return filesError(400, 'an octet-stream upload needs ?path= naming the file to write');
      }
      const result = await putFile(target, path, body, metadata, signal);
      if (isAnswer(result)) return result;
      done(path, result);
    } else {
      return filesError(
        400,
        `Content-Type ${JSON.stringify(type.slice(0, 100))}: send multipart/form-data or application/octet-stream`,
      );
    }
  } catch (error) {
    if (error instanceof MultipartError) return filesError(400, error.message);
    if (error instanceof UploadRefused) return filesError(error.status, error.message);
    throw error;
  }
  return {
    status: 200,
    headers: new Headers({ 'content-type': 'application/json' }),
    body: once(Buffer.from(JSON.stringify(written))),
  };
}
