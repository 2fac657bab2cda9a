import { isUtf8 } from 'node:buffer';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { type ArgSpec, validateKwargs, validateQuery } from '../protocol/arguments.js';
import {
  BadRequestError,
  InvalidJsonError,
  MethodNotAllowedError,
  PayloadTooLargeError,
  RequestTimeoutError,
  RouteNotFoundError,
  UnsupportedMediaTypeError,
} from './errors.js';
import {
  type BodyLimits,
  bodyChunks,
  drainBody,
  readBody,
  readBodyIfSmall,
  sendError,
  sendResult,
} from './http.js';

export type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

/**
 * Why a request's `closed` signal aborted: one reason made once (`abort()` without a reason builds
 * a DOMException, with its stack, per request).
 */
const CLOSED = new DOMException('the request was closed', 'AbortError');

/** What a handler gets: parsed path parameters, query, body and validated arguments. */
export interface RouteRequest<C> {
  method: Method;
  path: string;
  params: Record<string, string>;
  query: URLSearchParams;
  /** The JSON body (`body: 'json'` routes), `undefined` for an empty body. */
  body: unknown;
  /** The JSON body (POST/PUT/DELETE) or the query (GET) validated against the route's `args`. */
  args: Record<string, unknown>;
  /** The raw body, within the size and time limits (`body: 'stream'` routes). */
  stream(): AsyncIterable<Buffer>;
  /**
   * The raw body whole when it ends within `small` bytes, else the same bytes as a stream (as
   * {@link stream}), within the same limits (`body: 'stream'` routes). Use one of the two.
   */
  wholeIfSmall(small: number): Promise<Buffer | AsyncIterable<Buffer>>;
  /** Aborted when the client goes away before the answer is sent. */
  closed: AbortSignal;
  headers: IncomingMessage['headers'];
  ctx: C;
}

/** One entry of a {@link RouteTable}. `path` names parameters in braces: `/process/{id}/kill`. */
export interface Route<C> {
  method: Method;
  path: string;
  /** The route group the route belongs to. */
  group: string;
  /** One line for docs/server-api.md and `/capabilities`. */
  summary: string;
  /** How the body is read: parsed as JSON (default for POST/PUT/DELETE), streamed, or ignored. */
  body?: 'json' | 'stream' | 'none';
  /** Validated from the JSON body, or from the query for GET and `stream` routes. */
  args?: ArgSpec[];
  /** Answered without a token (`GET /health`). */
  public?: boolean;
  /** Refused to the limited token: only the full (control) token may call it (`PUT /tokens`). */
  control?: boolean;
  /** Returns the `200` JSON answer, or a `Reply`; throws a `SandboxError` for an error answer. */
  handler(req: RouteRequest<C>): unknown;
}

/**
 * Called after a route matched and before its body is read: throw (or reject) to refuse the
 * request. A guard that must look something up (the daemon's API keys) returns a promise.
 */
export type Guard<C> = (route: Route<C> | undefined, req: IncomingMessage) => void | Promise<void>;

interface Pattern<C> {
  path: string;
  segments: string[];
  literals: number;
  routes: Map<Method, Route<C>>;
}

function splitPath(path: string): string[] {
  return path.split('/').filter((s) => s !== '');
}

/**
 * A path's segments as routing sees them (empty ones dropped, each percent-decoded on its own, so
 * an encoded `/` stays inside its parameter). A gateway that checks paths must check these.
 */
export function decodeSegments(pathname: string): string[] {
  try {
    return splitPath(pathname).map(decodeURIComponent);
  } catch {
    throw new BadRequestError(`the path ${pathname} is not valid percent-encoding`);
  }
}

const isParam = (segment: string) => segment.startsWith('{') && segment.endsWith('}');

/**
 * Routes as data: a list of `{ method, path, group, handler }` entries. The table matches a
 * request (the most specific path wins: literal segments before parameters), answers 404 for an
 * unknown path and 405 with `Allow` for a known path with another method, reads and validates
 * the body, calls the handler and writes its answer.
 */
export class RouteTable<C> {
  private readonly patterns: Pattern<C>[] = [];

  constructor(routes: readonly Route<C>[] = []) {
    for (const route of routes) this.add(route);
  }

  /** Adds a route; a second route with the same method and path is a programming error. */
  add(route: Route<C>): this {
    let pattern = this.patterns.find((p) => p.path === route.path);
    if (!pattern) {
      const segments = splitPath(route.path);
      pattern = {
        path: route.path,
        segments,
        literals: segments.filter((s) => !isParam(s)).length,
        routes: new Map(),
      };
      this.patterns.push(pattern);
      this.patterns.sort((a, b) => b.literals - a.literals);
    }
    if (pattern.routes.has(route.method)) {
      throw new Error(`route ${route.method} ${route.path} is defined twice`);
    }
    pattern.routes.set(route.method, route);
    return this;
  }

  /** Every route, in the order added per path. */
  routes(): Route<C>[] {
    return this.patterns.flatMap((p) => [...p.routes.values()]);
  }

  /** The route for a request and its decoded path parameters; throws 404 or 405 errors. */
  match(method: string, pathname: string): { route: Route<C>; params: Record<string, string> } {
    const segments = decodeSegments(pathname);
    const path = `/${segments.join('/')}`;
    for (const pattern of this.patterns) {
      const params = matchSegments(pattern.segments, segments);
      if (!params) continue;
      const route = pattern.routes.get(method as Method);
      if (!route) {
        const allow = [...pattern.routes.keys()];
        throw new MethodNotAllowedError(
          `${method} is not allowed on ${path}; use ${allow.join(' or ')}`,
          { details: { allow } },
        );
      }
      return { route, params };
    }
    throw new RouteNotFoundError(
      `no route ${method} ${path}; GET /capabilities lists the routes of this server`,
    );
  }

  /** Serves one request end to end; never rejects. */
  async dispatch(
    req: IncomingMessage,
    res: ServerResponse,
    ctx: C,
    limits: BodyLimits,
    guard: Guard<C>,
  ): Promise<void> {
    // Made only for handlers that ask: an AbortController (and the DOMException its abort
    // creates) per request is a measurable share of a trivial call.
    // So is the `close` listener that aborts it, and the query's URLSearchParams.
    let closed: AbortController | undefined;
    const closedSignal = () => {
      if (!closed) {
        const controller = new AbortController();
        closed = controller;
        if (res.closed) controller.abort(CLOSED);
        else res.once('close', () => controller.abort(CLOSED));
      }
      return closed.signal;
    };
    // Split by hand: `new URL('//a/b', base)` would read `a` as a host name.
    const target = req.url ?? '/';
    const mark = target.indexOf('?');
    const pathname = mark < 0 ? target : target.slice(0, mark);
    let parsedQuery: URLSearchParams | undefined;
    const query = () => {
      parsedQuery ??= new URLSearchParams(mark < 0 ? '' : target.slice(mark + 1));
      return parsedQuery;
    };
    let matched: ReturnType<RouteTable<C>['match']> | undefined;
    try {
      try {
        matched = this.match(req.method ?? 'GET', pathname);
      } finally {
        // Also when nothing matched: a caller without the token gets 401, not a map of the paths.
        const checking = guard(matched?.route, req);
        if (checking) await checking;
      }
      const { route, params } = matched;
      const mode = route.body ?? (route.method === 'GET' ? 'none' : 'json');
      const body = mode === 'json' ? parseJson(await readBody(req, limits), req) : undefined;
      const args = route.args
        ? mode === 'json'
          ? validateKwargs(`${route.method} ${route.path}`, route.args, body)
          : validateQuery(`${route.method} ${route.path}`, route.args, query())
        : {};
      const result = await route.handler({
        method: route.method,
        path: pathname,
        params,
        get query() {
          return query();
        },
        body,
        args,
        stream: () => bodyChunks(req, streamLimits(limits)),
        wholeIfSmall: (small) => readBodyIfSmall(req, streamLimits(limits), small),
        get closed() {
          return closedSignal();
        },
        headers: req.headers,
        ctx,
      });
      await sendResult(res, result);
    } catch (error) {
      const headers: Record<string, string> =
        error instanceof MethodNotAllowedError ? { allow: error.allow.join(', ') } : {};
      // A streamed body the handler stopped reading (not one refused for size or time).
      if (
        !req.complete &&
        !(error instanceof PayloadTooLargeError || error instanceof RequestTimeoutError)
      ) {
        await drainBody(req, limits);
      }
      sendError(res, error, headers);
    }
  }
}

/** The limits of a streamed body (`body: 'stream'` routes). */
function streamLimits(limits: BodyLimits): BodyLimits {
  return {
    maxBytes: limits.maxStreamBytes ?? limits.maxBytes,
    timeoutMs: limits.streamTimeoutMs ?? limits.timeoutMs,
  };
}

/** Checks the literal segments first, so a pattern that does not match allocates nothing. */
function matchSegments(pattern: string[], segments: string[]): Record<string, string> | undefined {
  if (pattern.length !== segments.length) return undefined;
  for (let i = 0; i < pattern.length; i++) {
    const part = pattern[i] as string;
    if (!isParam(part) && part !== segments[i]) return undefined;
  }
  const params: Record<string, string> = {};
  for (let i = 0; i < pattern.length; i++) {
    const part = pattern[i] as string;
    if (isParam(part)) params[part.slice(1, -1)] = segments[i] ?? '';
  }
  return params;
}

function parseJson(bytes: Buffer, req: IncomingMessage): unknown {
  if (bytes.length === 0) return undefined;
  // No Content-Type is taken as JSON; a declared other type is refused, not guessed at.
  const type = req.headers['content-type'];
  if (type !== undefined && !/^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i.test(type)) {
    throw new UnsupportedMediaTypeError(
      `the body is declared as ${JSON.stringify(type)}; send JSON with Content-Type: application/json`,
    );
  }
  // Decoding would turn bytes that are not UTF-8 into U+FFFD, which may then parse as valid JSON.
  if (!isUtf8(bytes)) {
    throw new InvalidJsonError('the request body is not valid UTF-8; JSON bodies must be UTF-8');
  }
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (error) {
    throw new InvalidJsonError(
      `the request body is not valid JSON (${(error as Error).message}); send a JSON object with Content-Type: application/json`,
    );
  }
}
