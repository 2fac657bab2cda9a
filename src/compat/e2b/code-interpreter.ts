/**
 * E2B's code interpreter (port 49999 of a sandbox, as `@e2b/code-interpreter` calls it) over envd's
 * native code contexts: `/execute` and `/contexts` are translated onto envd's routes of the same
 * names, which already keep one interpreter per context. No state is kept here. See docs/e2b.md.
 */
import { ConnectError } from '@connectrpc/connect';
import { RESULT_FORMATS } from '../../../runtime/protocol/wire.js';
import { envdRequest, linesOf, readText } from './envd-client.js';
import type { EnvdFaceAnswer, EnvdFaceRequest } from './envd-face.js';

/** The port `@e2b/code-interpreter` names in `E2b-Sandbox-Port` (E2B calls it Jupyter's). */
export const E2B_CODE_PORT = 49999;

/**
 * The template `@e2b/code-interpreter`'s `Sandbox.create()` asks for. Unless a template of that
 * name is built, it is `base`, which has the `code` capability and the host's Python.
 */
export const E2B_CODE_TEMPLATE = 'code-interpreter-v1';

/**
 * An idle `/execute` stream gets a `keepalive` line this often, as from E2B's server (every 5 s
 * there). The writes are also how a client that went away is noticed (its FIN reads like a
 * half-close; a write draws its RST), so its cell is interrupted within about two of them.
 */
export const KEEPALIVE_MS = 1000;

/**
 * Output that does not end a line waits this long for the rest of it: Python's `print` writes the
 * text and its newline apart, and E2B's (Jupyter's) streams give them as one piece.
 */
export const HOLD_MS = 20;

/** The most output held in one piece. */
const HOLD_MAX = 64 * 1024;

/** The languages envd's code contexts run, by E2B's names (and E2B's short forms). */
const LANGUAGES: Record<string, string> = {
  python: 'python',
  javascript: 'javascript',
  js: 'javascript',
  bash: 'bash',
};

/** The fields of a `result` line that E2B's SDKs read; anything else would land in `extra`. */
const RESULT_FIELDS: readonly string[] = [...RESULT_FORMATS, 'data', 'chart', 'extra'];

/** A path of the code interpreter (E2B's server serves these and nothing else). */
export function isCodeInterpreterPath(path: string): boolean {
  return path === '/execute' || path === '/health' || /^\/contexts(\/|$)/.test(path);
}

/** A refusal as E2B's server gives it: plain text, the status, and the message as reason phrase. */
export class CodeInterpreterError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = 'CodeInterpreterError';
  }
}

/**
 * Plain text, as E2B's server answers errors. The message goes in the reason phrase too: without
 * its diagnostics option, the SDK's error reads only `${status} ${statusText}`.
 */
export function textAnswer(status: number, message: string): EnvdFaceAnswer {
  return {
    status,
    reason: message,
    headers: new Headers({ 'content-type': 'text/plain; charset=utf-8' }),
    body: Buffer.from(message),
  };
}

function jsonAnswer(status: number, value: unknown): EnvdFaceAnswer {
  return {
    status,
    headers: new Headers({ 'content-type': 'application/json' }),
    body: Buffer.from(JSON.stringify(value)),
  };
}

/** The body of a POST as a JSON object (`{}` when empty). */
function bodyObject(body: Uint8Array, route: string): Record<string, unknown> {
  if (body.length === 0) return {};
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(body).toString('utf8'));
  } catch (error) {
    throw new CodeInterpreterError(
      400,
      `the body of ${route} is not JSON (${(error as Error).message}): send a JSON object`,
    );
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new CodeInterpreterError(
      400,
      `the body of ${route} must be a JSON object, not ${Array.isArray(value) ? 'an array' : JSON.stringify(value).slice(0, 100)}`,
    );
  }
  return value as Record<string, unknown>;
}

/** A string field that may be absent or null. */
function optionalText(body: Record<string, unknown>, field: string, route: string) {
  const value = body[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'string') {
    throw new CodeInterpreterError(
      400,
      `${field} of ${route} must be a string, not ${JSON.stringify(value).slice(0, 100)}`,
    );
  }
  return value;
}

/** E2B's language name as envd's; a language envd does not run is refused, naming it. */
function languageOf(value: string | undefined): string {
  if (value === undefined) return 'python';
  const name = value.trim().toLowerCase();
  const language = LANGUAGES[name === '' ? 'python' : name];
  if (language === undefined) {
    throw new CodeInterpreterError(
      400,
      `language ${JSON.stringify(value.slice(0, 50))} is not run by abx: its code contexts run python, javascript (js) and bash`,
    );
  }
  return language;
}

/** `env_vars`: an object of strings, or absent. */
function envVars(body: Record<string, unknown>): Record<string, string> | undefined {
  const value = body.env_vars;
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new CodeInterpreterError(
      400,
      `env_vars of POST /execute must be an object of strings, not ${JSON.stringify(value).slice(0, 100)}`,
    );
  }
  for (const [key, item] of Object.entries(value)) {
    if (typeof item !== 'string') {
      throw new CodeInterpreterError(
        400,
        `env_vars.${key.slice(0, 50)} of POST /execute must be a string, not ${JSON.stringify(item).slice(0, 100)}`,
      );
    }
  }
  return value as Record<string, string>;
}

/** A context id from the path, as envd's path segment. */
function contextId(segment: string): string {
  let id: string;
  try {
    id = decodeURIComponent(segment);
  } catch {
    throw new CodeInterpreterError(400, `the context id ${segment.slice(0, 100)} is not valid`);
  }
  if (id === '' || id.length > 200) {
    throw new CodeInterpreterError(400, 'a context id is 1 to 200 characters long');
  }
  return encodeURIComponent(id);
}

/** envd's error answer (`{error, type}`) as E2B's: same status, envd's message. */
async function envdRefusal(status: number, text: string): Promise<CodeInterpreterError> {
  let message = text.slice(0, 1000);
  try {
    const body = JSON.parse(text) as { error?: unknown };
    if (typeof body.error === 'string') message = body.error;
  } catch {
    // not JSON: the text itself
  }
  // 404 (unknown context), 409 (dead context), 400, 403 (no `code`), 503 (no python3) keep theirs.
  return new CodeInterpreterError(
    [400, 403, 404, 409, 503].includes(status) ? status : 500,
    message,
  );
}

/** envd could not be reached (the sandbox stopped): 502, which the SDK raises as TimeoutError. */
function unreachable(error: unknown): CodeInterpreterError {
  const message =
    error instanceof ConnectError
      ? error.rawMessage
      : error instanceof Error
        ? error.message
        : String(error);
  return new CodeInterpreterError(502, message);
}

/** One JSON call to envd's native code routes. */
async function envdCall(
  request: EnvdFaceRequest,
  method: string,
  path: string,
  body?: unknown,
): Promise<unknown> {
  let res: Awaited<ReturnType<typeof envdRequest>>;
  try {
    res = await envdRequest(request.envd, method, path, body, request.signal);
  } catch (error) {
    throw unreachable(error);
  }
  const text = await readText(res);
  const status = res.statusCode ?? 500;
  if (status < 200 || status > 299) throw await envdRefusal(status, text);
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new CodeInterpreterError(500, `envd answered ${method} ${path} with non-JSON`);
  }
}

interface ContextView {
  id: string;
  language: string;
  cwd: string;
}

/** A native context as E2B's `Context`. */
function contextOf(value: unknown): ContextView {
  const { id, language, cwd } = (value ?? {}) as Partial<ContextView>;
  return { id: String(id), language: String(language), cwd: String(cwd) };
}

const line = (value: unknown) => Buffer.from(`${JSON.stringify(value)}\n`);

/** A native event as E2B's lines (none for events E2B has no line for). */
function translate(event: Record<string, unknown>): Record<string, unknown>[] {
  switch (event.type) {
    case 'result': {
      const result: Record<string, unknown> = { type: 'result' };
      for (const key of RESULT_FIELDS) if (event[key] !== undefined) result[key] = event[key];
      result.is_main_result = event.is_main_result === true;
      return [result];
    }
    case 'error':
      return [
        {
          type: 'error',
          name: String(event.name ?? 'Error'),
          value: String(event.value ?? ''),
          traceback: Array.isArray(event.traceback)
            ? event.traceback.join('\n')
            : String(event.traceback ?? ''),
        },
      ];
    case 'end':
      return [{ type: 'number_of_executions', execution_count: event.execution_count }];
    default:
      return [];
  }
}

/**
 * The NDJSON answer of `/execute`: envd's events translated as they arrive (never buffered), a
 * `keepalive` line first (so the answer's head goes out at once, within the SDK's request
 * timeout, however long the cell is silent) and whenever the cell is silent, and
 * `end_of_execution` last, as from E2B's server.
 */
async function* executeLines(
  events: AsyncIterator<string>,
  signal: AbortSignal,
): AsyncGenerator<Uint8Array> {
  const keepalive = line({ type: 'keepalive' });
  yield keepalive;
  let ended = false;
  /** Output that does not end a line yet. */
  let held: { type: string; text: string; timestamp: string } | undefined;
  const release = () => {
    const out = line({ ...held });
    held = undefined;
    return out;
  };
  try {
    let pending = events.next();
    for (;;) {
      let timer: NodeJS.Timeout | undefined;
      const tick = new Promise<'tick'>((resolve) => {
        timer = setTimeout(() => resolve('tick'), held ? HOLD_MS : KEEPALIVE_MS);
        timer.unref();
      });
      // A rejection is read by the race below (now or on a later turn), never left unhandled.
      pending.catch(() => undefined);
      const item = await Promise.race([pending, tick]).finally(() => clearTimeout(timer));
      if (item === 'tick') {
        yield held ? release() : keepalive;
        continue;
      }
      if (item.done) break;
      pending = events.next();
      let event: Record<string, unknown>;
      try {
        event = JSON.parse(item.value) as Record<string, unknown>;
      } catch {
        continue;
      }
      if ((event.type === 'stdout' || event.type === 'stderr') && typeof event.text === 'string') {
        if (held && (held.type !== event.type || held.text.length >= HOLD_MAX)) yield release();
        // The time the output began, as Jupyter's message date is (the Python SDK requires it).
        held ??= { type: event.type, text: '', timestamp: new Date().toISOString() };
        held.text += event.text;
        if (held.text.endsWith('\n')) yield release();
        continue;
      }
      if (held) yield release();
      if (event.type === 'end') ended = true;
      const out = translate(event);
      if (out.length > 0) yield Buffer.concat(out.map(line));
    }
    if (held) yield release();
  } catch (error) {
    if (signal.aborted) return;
    yield line({
      type: 'error',
      name: 'UnexpectedEndOfExecution',
      value: `the cell's output was cut: ${error instanceof Error ? error.message : String(error)}`,
      traceback: '',
    });
  }
  if (!ended && !signal.aborted) {
    yield line({
      type: 'error',
      name: 'UnexpectedEndOfExecution',
      value: 'envd ended the cell without its end (the sandbox may have stopped)',
      traceback: '',
    });
  }
  yield line({ type: 'end_of_execution' });
}

async function execute(request: EnvdFaceRequest): Promise<EnvdFaceAnswer> {
  const route = 'POST /execute';
  const body = bodyObject(request.body, route);
  const code = body.code;
  if (typeof code !== 'string') {
    throw new CodeInterpreterError(
      400,
      `code of ${route} must be a string (the cell to run), not ${code === undefined ? 'missing' : JSON.stringify(code).slice(0, 100)}`,
    );
  }
  const context = optionalText(body, 'context_id', route);
  const language = optionalText(body, 'language', route);
  if (context !== undefined && language !== undefined) {
    throw new CodeInterpreterError(
      400,
      'Only one of context_id or language can be provided: a context has its own language',
    );
  }
  const env = envVars(body);
  const native: Record<string, unknown> = {
    code,
    // The SDK's `timeoutMs` ends the cell by closing the request (envd then interrupts it), as
    // with E2B's server, which has no limit of its own.
    timeout_ms: 0,
    ...(context !== undefined ? { context_id: context } : { language: languageOf(language) }),
    ...(env ? { env } : {}),
  };
  let res: Awaited<ReturnType<typeof envdRequest>>;
  try {
    res = await envdRequest(request.envd, 'POST', '/execute', native, request.signal);
  } catch (error) {
    throw unreachable(error);
  }
  const status = res.statusCode ?? 500;
  if (status < 200 || status > 299) throw await envdRefusal(status, await readText(res));
  return {
    status: 200,
    headers: new Headers({
      'content-type': 'application/x-ndjson; charset=utf-8',
      'cache-control': 'no-store',
    }),
    body: executeLines(linesOf(res), request.signal),
  };
}

async function createContext(request: EnvdFaceRequest): Promise<EnvdFaceAnswer> {
  const route = 'POST /contexts';
  const body = bodyObject(request.body, route);
  const language = languageOf(optionalText(body, 'language', route));
  const cwd = optionalText(body, 'cwd', route);
  const made = await envdCall(request, 'POST', '/contexts', {
    language,
    ...(cwd !== undefined && cwd !== '' ? { cwd } : {}),
  });
  return jsonAnswer(200, contextOf(made));
}

/** Answers one request of `@e2b/code-interpreter` for port 49999 of the sandbox in `request`. */
export async function serveCodeInterpreter(
  request: EnvdFaceRequest,
  path: string,
): Promise<EnvdFaceAnswer> {
  const { method } = request;
  try {
    if (path === '/health') {
      if (method !== 'GET') throw new CodeInterpreterError(405, `${method} /health: use GET`);
      return jsonAnswer(200, 'OK');
    }
    if (path === '/execute') {
      if (method !== 'POST') throw new CodeInterpreterError(405, `${method} /execute: use POST`);
      return await execute(request);
    }
    if (path === '/contexts') {
      if (method === 'POST') return await createContext(request);
      if (method === 'GET') {
        const listed = (await envdCall(request, 'GET', '/contexts')) as { contexts?: unknown[] };
        return jsonAnswer(200, (listed.contexts ?? []).map(contextOf));
      }
      throw new CodeInterpreterError(405, `${method} /contexts: list with GET, create with POST`);
    }
    const restart = /^\/contexts\/([^/]+)\/restart$/.exec(path);
    if (restart) {
      if (method !== 'POST') {
        throw new CodeInterpreterError(405, `${method} /contexts/{id}/restart: use POST`);
      }
      await envdCall(request, 'POST', `/contexts/${contextId(restart[1] as string)}/restart`);
      return jsonAnswer(200, null);
    }
    const one = /^\/contexts\/([^/]+)$/.exec(path);
    if (one) {
      if (method !== 'DELETE') {
        throw new CodeInterpreterError(405, `${method} /contexts/{id}: remove with DELETE`);
      }
      await envdCall(request, 'DELETE', `/contexts/${contextId(one[1] as string)}`);
      return jsonAnswer(200, null);
    }
    throw new CodeInterpreterError(
      404,
      `${method} ${path.slice(0, 200)} is not a route of the code interpreter (abx serves POST /execute, GET and POST /contexts, POST /contexts/{id}/restart, DELETE /contexts/{id}, GET /health)`,
    );
  } catch (error) {
    if (error instanceof CodeInterpreterError) return textAnswer(error.status, error.message);
    if (request.signal.aborted) throw error;
    return textAnswer(502, unreachable(error).message);
  }
}
