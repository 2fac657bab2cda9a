import { basename } from 'node:path/posix';
import { gunzipSync } from 'node:zlib';
import { type EnvdTarget, envdRequest, readText } from './envd-client.js';
import { boundaryOf, MultipartError, parseMultipart } from './multipart.js';
import { E2B_USER } from './process-service.js';

/** Largest file `POST /files` takes (read whole by the gateway; gzip's output counts too). */
export const MAX_UPLOAD_BYTES = 64 * 1024 * 1024;

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

/** `POST /files`: one file (octet-stream, or a one-part form) or several (a form), each written whole. */
export async function writeFiles(
  target: EnvdTarget,
  query: URLSearchParams,
  headers: Headers,
  raw: Buffer,
  signal: AbortSignal,
): Promise<FilesAnswer> {
  const refused = userRefusal(query);
  if (refused) return refused;
  let body = raw;
  const encoding = (headers.get('content-encoding') ?? 'identity').trim().toLowerCase();
  if (encoding === 'gzip') {
    try {
      body = gunzipSync(raw, { maxOutputLength: MAX_UPLOAD_BYTES });
    } catch (error) {
      return filesError(
        400,
        `the gzip body could not be read (or is over ${MAX_UPLOAD_BYTES} bytes once unpacked): ${(error as Error).message}`,
      );
    }
  } else if (encoding !== 'identity') {
    return filesError(
      415,
      `Content-Encoding ${JSON.stringify(encoding.slice(0, 40))}: send gzip or none`,
    );
  }
  const type = headers.get('content-type') ?? '';
  const path = query.get('path') || undefined;
  let files: { path: string | undefined; data: Buffer }[];
  if (/^multipart\/form-data/i.test(type)) {
    try {
      const parts = parseMultipart(body, boundaryOf(type)).filter((p) => p.name === 'file');
      if (parts.length === 0) return filesError(400, 'the form has no `file` part');
      files = parts.map((p) => ({
        path: parts.length === 1 && path ? path : p.filename || path,
        data: p.data,
      }));
    } catch (error) {
      if (error instanceof MultipartError) return filesError(400, error.message);
      throw error;
    }
  } else if (/^application\/octet-stream/i.test(type) || type === '') {
    files = [{ path, data: body }];
  } else {
    return filesError(
      400,
      `Content-Type ${JSON.stringify(type.slice(0, 100))}: send multipart/form-data or application/octet-stream`,
    );
  }
  const missing = files.find((f) => !f.path);
  if (missing) {
    return filesError(400, 'a file has no path: give ?path= or the full path as the part filename');
  }
  const written: { name: string; type: 'file'; path: string }[] = [];
  for (const file of files) {
    const res = await envdRequest(
      target,
      'PUT',
      `/files/write?path=${encodeURIComponent(file.path as string)}`,
      file.data,
      signal,
    );
    const text = await readText(res);
    const status = res.statusCode ?? 502;
    if (status < 200 || status > 299) return fromEnvd(status, text, `write ${file.path}`);
    const done = JSON.parse(text) as { path: string };
    written.push({ name: basename(done.path), type: 'file', path: done.path });
  }
  return {
    status: 200,
    headers: new Headers({ 'content-type': 'application/json' }),
    body: once(Buffer.from(JSON.stringify(written))),
  };
}
