import { E2B_USER } from './process-service.js';

/** An answer of E2B's `/files`: its status, headers and body, whole. */
export interface FilesAnswer {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

/** envd's answer to a request passed on, taken whole by the gateway: its status and body. */
export interface EnvdAnswer {
  status: number;
  body: Buffer;
}

/**
 * A `/files` request passed to envd's native route as bytes (the gateway sends its body on as it
 * arrives, whatever its size): envd's route, and its error answers rewritten into E2B's shape
 * (its other answers pass as they are).
 */
export interface FilesPassOn {
  /** envd's route, with its query. */
  target: string;
  /** envd's error answer in E2B's shape. */
  translate(answer: EnvdAnswer): FilesAnswer;
  /**
   * `?username=root`: for root's envd, where the sandbox allows root; the gateway refuses it
   * with {@link rootRefused} elsewhere.
   */
  root?: true;
}

/** `?username=root` where the sandbox does not allow root (no root envd). */
export function rootRefused(): FilesAnswer {
  return filesError(
    403,
    `username 'root' is refused: abx never gives a sandbox's processes or files root (they are its unprivileged user '${E2B_USER}'); leave it out or use '${E2B_USER}'`,
  );
}

/** E2B's REST error body: `{ "code": <status>, "message" }`. */
export function filesError(status: number, message: string): FilesAnswer {
  return {
    status,
    headers: new Headers({ 'content-type': 'application/json' }),
    body: Buffer.from(JSON.stringify({ code: status, message })),
  };
}

/** envd's error answer (`{error, type, code}`): its message, and its errno code when it has one. */
function envdError(body: Buffer): { message: string; code: string | undefined } {
  const text = body.toString('utf8');
  try {
    const parsed = JSON.parse(text) as { error?: unknown; code?: unknown };
    if (typeof parsed.error === 'string') {
      return {
        message: parsed.error,
        code: typeof parsed.code === 'string' ? parsed.code : undefined,
      };
    }
  } catch {
    // not JSON: the text itself
  }
  return { message: text.slice(0, 500), code: undefined };
}

/** envd's error answer in E2B's shape, with envd's status (`what` leads the message, when given). */
function fromEnvd(answer: EnvdAnswer, what?: string): FilesAnswer {
  const { status } = answer;
  const { message } = envdError(answer.body);
  return filesError(
    status >= 400 && status < 600 ? status : 502,
    what ? `${what}: ${message}` : message,
  );
}

/** The user of `?username=`: the sandbox's own user, or root (routed by the gateway). */
function userRefusal(query: URLSearchParams): FilesAnswer | { root?: true } {
  const user = query.get('username');
  if (user === null || user === '' || user === E2B_USER) return {};
  if (user === 'root') return { root: true };
  return filesError(
    403,
    `username ${JSON.stringify(user.slice(0, 64))} is refused: an abx sandbox has one user, '${E2B_USER}' (and root, where its template allows root); leave it out or use '${E2B_USER}'`,
  );
}

/** `GET /files?path=`: envd's `GET /files/read`, its bytes passed on as they are. */
export function readPassOn(query: URLSearchParams): FilesPassOn | FilesAnswer {
  const user = userRefusal(query);
  if ('status' in user) return user;
  const path = query.get('path');
  if (!path) return filesError(400, 'GET /files needs ?path= naming the file to read');
  return {
    ...user,
    target: `/files/read?path=${encodeURIComponent(path)}`,
    translate: (answer) => fromEnvd(answer, `read ${path}`),
  };
}

/** envd's errno codes for a full disk: E2B's envd answers them 507 (the SDK's NotEnoughSpaceError). */
const DISK_FULL = new Set(['ENOSPC', 'EDQUOT']);

/**
 * `POST /files`: envd's `POST /files/upload?e2b=true`, which takes E2B's forms and raw bodies as
 * they are (multipart or octet-stream, gzip, `X-Metadata-*`), writes each file as its bytes arrive
 * and in turn, and answers E2B's list of entries itself, which goes to the client as bytes, as a
 * download does (rewriting it here cost the daemon about 0.08 ms a call). envd's errors are
 * rewritten into E2B's shape. A form that turns out malformed keeps the files of the parts before
 * the break, as E2B's envd does.
 */
export function uploadPassOn(query: URLSearchParams): FilesPassOn | FilesAnswer {
  const user = userRefusal(query);
  if ('status' in user) return user;
  const path = query.get('path');
  return {
    ...user,
    target: path
      ? `/files/upload?e2b=true&path=${encodeURIComponent(path)}`
      : '/files/upload?e2b=true',
    translate: (answer) => {
      const { message, code } = envdError(answer.body);
      if (code !== undefined && DISK_FULL.has(code)) {
        return filesError(507, `the sandbox's disk is full: ${message}`);
      }
      return fromEnvd(answer);
    },
  };
}
