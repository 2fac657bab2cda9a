import type { DescMethodServerStreaming, DescMethodUnary } from '@bufbuild/protobuf';
import { Code, ConnectError, createConnectRouter, createContextValues } from '@connectrpc/connect';
import type { UniversalHandler } from '@connectrpc/connect/protocol';
import { codeToHttpStatus, endStreamFlag, errorToJson } from '@connectrpc/connect/protocol-connect';
import {
  E2B_CODE_PORT,
  isCodeInterpreterPath,
  serveCodeInterpreter,
  textAnswer,
} from './code-interpreter.js';
import {
  type ServerStreamImpl,
  type StreamAnswer,
  serverStreamHandler,
  type UnaryImpl,
  unaryHandler,
} from './connect-stream.js';
import type { EnvdTarget } from './envd-client.js';
import { type FilesPassOn, filesError, readPassOn, uploadPassOn } from './files-route.js';
import { filesystemService } from './filesystem-service.js';
import { Filesystem } from './gen/filesystem/filesystem_pb.js';
import { Process } from './gen/process/process_pb.js';
import { ENVD_TARGET, processService } from './process-service.js';
import { watchService } from './watch-service.js';

/** E2B's envd port, which the SDKs name in `E2b-Sandbox-Port`. */
export const E2B_ENVD_PORT = 49983;

/** Largest request body the face reads for an RPC (a Connect request is one small JSON message). */
export const MAX_RPC_BODY_BYTES = 4 * 1024 * 1024;

/** The largest body the gateway reads whole for an E2B request (one it does not stream). */
export function e2bBodyLimit(_path: string, _port = E2B_ENVD_PORT): number {
  return MAX_RPC_BODY_BYTES;
}

/** An E2B request the gateway passes to envd as bytes ({@link E2bEnvdFace.passOn}). */
export type E2bPassOn = FilesPassOn;

/** One E2B request to envd, checked (sandbox, token) by the gateway. */
export interface EnvdFaceRequest {
  method: string;
  /** The request target: path and query. */
  target: string;
  headers: Headers;
  /** The body, read whole. */
  body: Uint8Array;
  envd: EnvdTarget;
  /** The sandbox port the request named: envd's (49983, the default) or the code interpreter's. */
  port?: number;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
}

/** The answer: a status, headers, and the body in pieces as they are produced. */
export interface EnvdFaceAnswer {
  status: number;
  /** The status line's reason phrase, when it says more than the status's usual one. */
  reason?: string;
  headers: Headers;
  /**
   * The body: whole (sent with its Content-Length, in one write with the head), or in pieces as
   * they are produced (sent chunked).
   */
  body: AsyncIterable<Uint8Array> | Uint8Array;
}

const SERVICES = ['process.Process', 'filesystem.Filesystem'];

function pathOf(target: string): string {
  const mark = target.indexOf('?');
  return mark < 0 ? target : target.slice(0, mark);
}

async function* once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  if (bytes.length > 0) yield bytes;
}

/** A Connect error answer: an end-stream envelope for a stream, a JSON body for a unary call. */
export function connectErrorAnswer(error: ConnectError, streaming: boolean): EnvdFaceAnswer {
  const json = errorToJson(error, undefined);
  if (streaming) {
    const data = Buffer.from(JSON.stringify({ error: json }));
    const frame = Buffer.alloc(5 + data.length);
    frame[0] = endStreamFlag;
    frame.writeUInt32BE(data.length, 1);
    data.copy(frame, 5);
    return {
      status: 200,
      headers: new Headers({ 'content-type': 'application/connect+json' }),
      body: frame,
    };
  }
  return {
    status: codeToHttpStatus(error.code),
    headers: new Headers({ 'content-type': 'application/json' }),
    body: Buffer.from(JSON.stringify(json)),
  };
}

/** Whether a request is shaped as a Connect stream (its errors go in an end-stream envelope). */
function isStreaming(headers: Headers): boolean {
  return /^application\/connect\+/i.test(headers.get('content-type') ?? '');
}

/**
 * The answer's pieces, but cut (the iterator throws, and the gateway drops the connection) once
 * envd's stream broke under the call: the sandbox is gone, and E2B's SDKs learn that from a cut
 * connection and a `/health` that answers 502, not from an error message.
 */
async function* cutWhenLost(
  body: AsyncIterable<Uint8Array>,
  target: EnvdTarget,
): AsyncGenerator<Uint8Array> {
  for await (const piece of body) {
    if (target.lost) throw new Error(`sandbox ${target.sandboxId} went away under the call`);
    yield piece;
  }
}

/**
 * envd's E2B face: `process.Process` and `filesystem.Filesystem` over Connect (JSON codec),
 * `/files` and `GET /health`, and the code interpreter's port 49999 (code-interpreter.ts), each
 * call mapped onto envd's native routes of the sandbox the gateway checked. The gateway hands it the
 * requests {@link claims} says are E2B's; it keeps no state of its own.
 */
export class E2bEnvdFace {
  private readonly handlers = new Map<string, UniversalHandler>();
  /** The server-streaming methods' requests as E2B's SDKs send them (connect-stream.ts). */
  private readonly streams = new Map<string, ReturnType<typeof serverStreamHandler>>();
  /** The unary methods' requests as E2B's SDKs send them (connect-stream.ts). */
  private readonly unaries = new Map<string, ReturnType<typeof unaryHandler>>();

  constructor() {
    const options = {
      // E2B's SDKs speak Connect only; the JSON codec, no compression.
      grpc: false,
      grpcWeb: false,
      acceptCompression: [],
      readMaxBytes: MAX_RPC_BODY_BYTES,
    };
    const router = createConnectRouter(options);
    const services = [
      [Process, processService],
      [Filesystem, { ...filesystemService, ...watchService }],
    ] as const;
    for (const [service, impl] of services) {
      router.service(service, impl);
      for (const method of service.methods) {
        const fn = (impl as Record<string, unknown>)[method.localName];
        if (typeof fn !== 'function') continue;
        const path = `/${service.typeName}/${method.name}`;
        if (method.methodKind === 'server_streaming') {
          this.streams.set(
            path,
            serverStreamHandler(
              method as DescMethodServerStreaming,
              fn as ServerStreamImpl,
              options,
            ),
          );
        } else if (method.methodKind === 'unary') {
          this.unaries.set(path, unaryHandler(method as DescMethodUnary, fn as UnaryImpl, options));
        }
      }
    }
    for (const handler of router.handlers) this.handlers.set(handler.requestPath, handler);
  }

  /**
   * Whether a request for `port` of a sandbox is E2B's: it names the sandbox with E2B's headers
   * (`E2b-Sandbox-Id`), or its path is one of E2B's envd services. Other ports pass as they are.
   */
  claims(port: number, path: string, e2bHeaders: boolean): boolean {
    // The code interpreter's port is E2B's when the SDK names it, or for its routes by Host.
    if (port === E2B_CODE_PORT) return e2bHeaders || isCodeInterpreterPath(pathOf(path));
    if (port !== E2B_ENVD_PORT) return false;
    if (e2bHeaders) return true;
    const name = pathOf(path).split('/')[1] ?? '';
    // `/files` itself is E2B's (envd's native file routes are below it: `/files/read`, …).
    return SERVICES.includes(name) || pathOf(path) === '/files';
  }

  /** An error of the gateway's (sandbox gone, wrong token) in the shape the request expects. */
  refusal(
    headers: Headers,
    path: string,
    status: number,
    message: string,
    port = E2B_ENVD_PORT,
  ): EnvdFaceAnswer {
    if (port === E2B_CODE_PORT) {
      // E2B's proxy answers a sandbox that is gone with 502: the code interpreter SDK's TimeoutError.
      return textAnswer(status === 404 ? 502 : status, message);
    }
    const code =
      status === 401
        ? Code.Unauthenticated
        : status === 403
          ? Code.PermissionDenied
          : status === 404
            ? // E2B's proxy answers a sandbox that is gone with 502: the SDKs' "unavailable".
              Code.Unavailable
            : status === 400 || status === 413 || status === 431
              ? Code.InvalidArgument
              : status === 408
                ? Code.DeadlineExceeded
                : Code.Unavailable;
    const name = pathOf(path).split('/')[1] ?? '';
    if (!SERVICES.includes(name)) {
      // E2B's REST routes (`/files`, `/health`) answer `{code, message}` with the status. A
      // sandbox that is gone is E2B's proxy's 502: `isRunning()` is then false, and a file call
      // raises the SDK's TimeoutError.
      const shown = status === 404 ? 502 : status;
      const body = Buffer.from(JSON.stringify({ code: shown, message }));
      return {
        status: shown,
        headers: new Headers({ 'content-type': 'application/json' }),
        body,
      };
    }
    return connectErrorAnswer(new ConnectError(message, code), isStreaming(headers));
  }

  /**
   * An E2B request that goes to envd's native route as bytes rather than through {@link serve}:
   * `/files` downloads and uploads, which may be of any size, and which envd's `GET /files/read`
   * and `POST /files/upload?e2b=true` take and answer as E2B's envd does. The gateway sends the
   * request to the route the answer names, its body on as it arrives, passes envd's answer on as
   * bytes, and hands an error answer whole to its `translate`. A refusal is answered at once;
   * undefined: {@link serve} it.
   */
  passOn(
    method: string,
    target: string,
    port = E2B_ENVD_PORT,
  ): E2bPassOn | EnvdFaceAnswer | undefined {
    if (port !== E2B_ENVD_PORT) return undefined;
    const path = pathOf(target);
    if (path !== '/files') return undefined;
    const query = new URLSearchParams(target.slice(path.length + 1));
    if (method === 'GET') return readPassOn(query);
    if (method === 'POST') return uploadPassOn(query);
    return undefined;
  }

  async serve(request: EnvdFaceRequest): Promise<EnvdFaceAnswer> {
    const path = pathOf(request.target);
    if (request.port === E2B_CODE_PORT) return serveCodeInterpreter(request, path);
    if (path === '/health') {
      if (request.method !== 'GET' && request.method !== 'HEAD') {
        return this.plainError(405, `${request.method} /health: use GET`);
      }
      return { status: 204, headers: new Headers(), body: new Uint8Array(0) };
    }
    if (path === '/files') {
      // GET and POST are passed to envd as bytes (passOn).
      return filesError(405, `${request.method} /files: read with GET, write with POST`);
    }
    const name = path.split('/')[1] ?? '';
    if (!SERVICES.includes(name)) {
      return this.plainError(
        404,
        `${request.method} ${path.slice(0, 200)} is not a route of envd's E2B face (abx serves /process.Process/*, /filesystem.Filesystem/*, /files, /health)`,
      );
    }
    const handler = this.handlers.get(path);
    if (!handler) {
      return connectErrorAnswer(
        new ConnectError(`${path.slice(1, 200)} is not implemented by abx`, Code.Unimplemented),
        isStreaming(request.headers),
      );
    }
    const url = `http://envd${request.target}`;
    const contextValues = createContextValues().set(ENVD_TARGET, request.envd);
    const call = {
      method: request.method,
      url,
      header: request.headers,
      body: request.body,
      signal: request.signal,
      contextValues,
    };
    const unary = await this.unaries.get(path)?.(call);
    if (unary) return unary;
    const fast: StreamAnswer | undefined = await this.streams.get(path)?.(call);
    if (fast) return { ...fast, body: cutWhenLost(fast.body, request.envd) };
    const answer = await handler({
      httpVersion: '1.1',
      url,
      method: request.method,
      header: request.headers,
      body: once(request.body),
      signal: request.signal,
      contextValues,
    });
    if (answer.body === undefined && answer.status >= 400) {
      // connect's bodiless refusals (405, 415, 505) get a message saying what to send instead.
      const kind = handler.method.methodKind === 'unary' ? 'a unary call' : 'a server stream';
      const type =
        handler.method.methodKind === 'unary' ? 'application/json' : 'application/connect+json';
      const why =
        answer.status === 405
          ? `${request.method} ${path.slice(0, 200)}: Connect calls are POST`
          : answer.status === 415
            ? `${path.slice(1, 200)} is ${kind}: send Content-Type ${type} (E2B's JSON codec)`
            : `${path.slice(1, 200)}: unsupported request (${answer.status}); send Connect-Protocol-Version: 1`;
      return {
        status: answer.status,
        headers: new Headers({ 'content-type': 'application/json' }),
        body: Buffer.from(JSON.stringify({ code: 'invalid_argument', message: why })),
      };
    }
    const headers = new Headers(answer.header);
    if (answer.body === undefined) {
      return { status: answer.status, headers, body: new Uint8Array(0) };
    }
    if (handler.method.methodKind === 'unary') {
      // One message: sent whole, with its length, as E2B's envd sends a unary answer.
      const pieces: Uint8Array[] = [];
      for await (const piece of answer.body) pieces.push(piece);
      return { status: answer.status, headers, body: Buffer.concat(pieces) };
    }
    return { status: answer.status, headers, body: cutWhenLost(answer.body, request.envd) };
  }

  private plainError(status: number, message: string): EnvdFaceAnswer {
    return {
      status,
      headers: new Headers({ 'content-type': 'application/json' }),
      body: Buffer.from(JSON.stringify({ code: status, message })),
    };
  }
}
