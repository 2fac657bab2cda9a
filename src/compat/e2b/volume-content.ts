/**
 * E2B's volume content API: `/volumecontent/{volumeID}/dir`, `/file` and `/path`, what the SDK's
 * `Volume` instance methods call (at `E2B_VOLUME_API_URL`, else `https://api.{domain}`). A
 * volume's files are reached without a sandbox, through the provider's VolumeFiles, with the
 * volume's token as `Authorization: Bearer` (what `POST /volumes` and `GET /volumes/{id}`
 * answer). Errors are E2B's `{ code, message }`, the code a string as its content API has it.
 */
import { isUtf8 } from 'node:buffer';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { pipeline } from 'node:stream/promises';
import { type BodyLimits, bodyChunks, drainBody, readBody } from '../../../runtime/server/http.js';
import {
  AuthenticationError,
  errorResponse,
  InvalidArgumentError,
  InvalidJsonError,
  MethodNotAllowedError,
  RouteNotFoundError,
} from '../../errors.js';
import type { VolumeEntry, VolumeSpec } from '../../providers/provider.js';
import type { E2bBackend } from './backend.js';

/** The first path segment of the content API. */
export const VOLUME_CONTENT_SEGMENT = 'volumecontent';

/** E2B's deepest listing. */
const MAX_DEPTH = 10;
/** How long an upload may take: the SDK's own file timeout (1 h). */
const UPLOAD_TIMEOUT_MS = 3_600_000;

/** The methods each route takes. */
const ROUTES: Record<string, readonly string[]> = {
  dir: ['GET', 'POST'],
  file: ['GET', 'PUT'],
  path: ['GET', 'DELETE', 'PATCH'],
};

/** `VolumeEntryStat`. */
function entryJson(entry: VolumeEntry) {
  const iso = (ms: number) => new Date(ms).toISOString();
  return {
    name: entry.name,
    path: entry.path,
    type: entry.type,
    size: entry.size,
    mode: entry.mode,
    uid: entry.uid,
    gid: entry.gid,
    atime: iso(entry.atime),
    mtime: iso(entry.mtime),
    ctime: iso(entry.ctime),
    ...(entry.target === undefined ? {} : { target: entry.target }),
  };
}

/** A whole number from 0 to 2^32-1 in the query (uid, gid, mode), or undefined when absent. */
function queryNumber(query: URLSearchParams, name: string): number | undefined {
  const text = query.get(name);
  if (text === null || text === '') return undefined;
  if (!/^\d{1,10}$/.test(text) || Number(text) > 0xffffffff) {
    throw new InvalidArgumentError(`${name} must be a whole number, not ${JSON.stringify(text)}`);
  }
  return Number(text);
}

function queryFlag(query: URLSearchParams, name: string): boolean {
  const text = query.get(name);
  if (text === null || text === '' || text === 'false') return false;
  if (text === 'true') return true;
  throw new InvalidArgumentError(`${name} must be true or false, not ${JSON.stringify(text)}`);
}

function queryPath(query: URLSearchParams): string {
  const path = query.get('path');
  if (path === null) {
    throw new InvalidArgumentError('path is required: ?path=/folder/file in the volume');
  }
  return path;
}

/** The ownership fields a request gives (uid, gid, mode), each a whole number when present. */
function ownership(source: (name: 'uid' | 'gid' | 'mode') => number | undefined) {
  const uid = source('uid');
  const gid = source('gid');
  const mode = source('mode');
  return {
    ...(uid === undefined ? {} : { uid }),
    ...(gid === undefined ? {} : { gid }),
    ...(mode === undefined ? {} : { mode }),
  };
}

/** PATCH's body: `{ uid?, gid?, mode? }`, whole numbers. */
function patchBody(bytes: Buffer) {
  let body: unknown = {};
  if (bytes.length > 0) {
    if (!isUtf8(bytes)) throw new InvalidJsonError('the request body is not valid UTF-8 JSON');
    try {
      body = JSON.parse(bytes.toString('utf8'));
    } catch (error) {
      throw new InvalidJsonError(
        `the request body is not valid JSON (${(error as Error).message}): send { "uid"?, "gid"?, "mode"? }`,
      );
    }
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new InvalidArgumentError('the body must be a JSON object { "uid"?, "gid"?, "mode"? }');
  }
  const fields = body as Record<string, unknown>;
  return ownership((name) => {
    const value = fields[name];
    if (value === undefined || value === null) return undefined;
    if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) {
      throw new InvalidArgumentError(
        `${name} must be a whole number, not ${JSON.stringify(value)}`,
      );
    }
    return value;
  });
}

export class E2bVolumeContent {
  constructor(
    private readonly backend: E2bBackend,
    /** Limits of small bodies (PATCH's JSON), and of what is drained after a refusal. */
    private readonly limits: BodyLimits,
  ) {}

  /** Whether a request path is the content API's. */
  static claims(path: string): boolean {
    return path.split('/')[1] === VOLUME_CONTENT_SEGMENT;
  }

  /** Serves one request end to end; never rejects. */
  async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      await this.serve(req, res);
    } catch (error) {
      try {
        if (!req.complete) await drainBody(req, this.limits);
        sendError(res, error);
      } catch {
        res.destroy();
      }
    }
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const target = req.url ?? '/';
    const mark = target.indexOf('?');
    const pathname = mark < 0 ? target : target.slice(0, mark);
    const query = new URLSearchParams(mark < 0 ? '' : target.slice(mark + 1));
    const [, , rawId = '', kind = '', ...rest] = pathname.split('/');
    let id = rawId;
    try {
      id = decodeURIComponent(rawId);
    } catch {
      // Not percent-encoding: no volume has that id, and the token check says so.
    }
    // Before anything else: a request without the volume's token learns nothing.
    const header = req.headers.authorization;
    const token = typeof header === 'string' ? /^Bearer (.+)$/i.exec(header)?.[1] : undefined;
    const volume = await this.backend.volumeOfToken(id, token);
    if (!volume) {
      throw new AuthenticationError(
        `${token === undefined ? 'missing' : 'wrong'} token for volume ${JSON.stringify(id.slice(0, 100))}: send Authorization: Bearer <token>, the token Volume.create and Volume.connect get (GET /volumes/{volumeID})`,
      );
    }
    const methods = ROUTES[kind];
    if (!methods || rest.length > 0) {
      throw new RouteNotFoundError(
        `no route ${pathname.slice(0, 200)} in the volume content API: /volumecontent/{volumeID}/dir, /file or /path`,
      );
    }
    const method = req.method ?? 'GET';
    if (!methods.includes(method)) {
      throw new MethodNotAllowedError(
        `/volumecontent/{volumeID}/${kind} takes ${methods.join(', ')}`,
        {
          details: { allow: [...methods] },
        },
      );
    }
    const path = queryPath(query);
    const files = this.backend.volumeFiles();
    const fromQuery = () => ownership((name) => queryNumber(query, name));
    switch (`${method} ${kind}`) {
      case 'GET dir': {
        const depth = queryNumber(query, 'depth') ?? 1;
        if (depth > MAX_DEPTH) {
          throw new InvalidArgumentError(`depth must be between 1 and ${MAX_DEPTH}, not ${depth}`);
        }
        const entries = await files.list(volume, path, Math.max(1, depth));
        return sendJson(res, 200, entries.map(entryJson));
      }
      case 'POST dir': {
        const entry = await files.makeDir(volume, path, {
          ...fromQuery(),
          parents: queryFlag(query, 'force'),
        });
        return sendJson(res, 201, entryJson(entry));
      }
      case 'GET file':
        return this.download(res, volume, path);
      case 'PUT file': {
        const options = { ...fromQuery(), overwrite: queryFlag(query, 'force') };
        // The volume's size bounds an upload: a larger one could never fit.
        const body = bodyChunks(req, {
          maxBytes: volume.sizeBytes,
          timeoutMs: UPLOAD_TIMEOUT_MS,
        });
        const entry = await files.write(volume, path, body, options);
        return sendJson(res, 201, entryJson(entry));
      }
      case 'GET path':
        return sendJson(res, 200, entryJson(await files.stat(volume, path)));
      case 'DELETE path':
        await files.remove(volume, path);
        res.writeHead(204).end();
        return;
      default: {
        const changes = patchBody(await readBody(req, this.limits));
        return sendJson(res, 200, entryJson(await files.update(volume, path, changes)));
      }
    }
  }

  private async download(res: ServerResponse, volume: VolumeSpec, path: string): Promise<void> {
    const { size, stream } = await this.backend.volumeFiles().read(volume, path);
    res.writeHead(200, {
      'content-type': 'application/octet-stream',
      'content-length': String(size),
    });
    // A client that goes away ends the pipeline; its rejection is nothing to answer.
    await pipeline(stream, res).catch(() => stream.destroy());
  }
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res
    .writeHead(status, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(text),
    })
    .end(text);
}

function sendError(res: ServerResponse, error: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const { status, body } = errorResponse(error);
  const allow =
    error instanceof MethodNotAllowedError ? { allow: error.allow.join(', ') } : undefined;
  const text = JSON.stringify({ code: String(status), message: body.error });
  res
    .writeHead(status, {
      ...allow,
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(text),
    })
    .end(text);
}
