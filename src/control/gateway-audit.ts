import type { AuditKind, AuditLog } from './audit.js';
import { auditText } from './audit.js';
import type { RequestTarget, Route } from './gateway-connection.js';
import type { RequestHead } from './gateway-http.js';

/**
 * What the gateway records in the audit trail of the requests it passes to a sandbox: from the
 * request as the client sent it (its head, and for a few small JSON bodies the body), never from
 * the sandbox's answer. Which requests, and what of them, is in docs/events.md ("Audit trail").
 */

/** Body bytes a tap keeps to read the request (a JSON body over it is recorded without it). */
export const AUDIT_BODY_KEEP = 64 * 1024;
/** A batch write's body is kept up to this to name each file. */
const BATCH_BODY_KEEP = 1024 * 1024;

/** Takes a request's body as it passes (data ranges, never framing) and records it at its end. */
export interface AuditTap {
  data(chunk: Buffer): void;
  /** Counts bytes that passed without a body (a local file handed over by descriptor). */
  count?(bytes: number): void;
  end(): void;
  /**
   * Watches the answer's bytes as they pass to the client, when the request is the only one its
   * connection to the sandbox has in flight: `end` once it is answered (not called when the
   * connection breaks first).
   */
  answer?: { data(chunk: Buffer): void; end(): void };
}

/** Bytes of an answer's start and end a watcher keeps (its pid, and its `exit` event). */
const ANSWER_KEEP = 8 * 1024;

/**
 * Records a native command's exit from the end of envd's `POST /exec` stream as it passed to the
 * client (best effort: the stream's last 8 KiB hold its `exit` event unless the connection
 * breaks first).
 */
function exitWatcher(audit: AuditLog, source: Source): NonNullable<AuditTap['answer']> {
  let head = Buffer.alloc(0);
  let tail = Buffer.alloc(0);
  return {
    data(chunk) {
      if (head.length < ANSWER_KEEP) head = Buffer.concat([head, chunk]).subarray(0, ANSWER_KEEP);
      tail = Buffer.concat([tail, chunk]);
      if (tail.length > ANSWER_KEEP) tail = tail.subarray(tail.length - ANSWER_KEEP);
    },
    end() {
      const text = tail.toString('latin1');
      const exits = [
        ...text.matchAll(
          /\{"exit":\{"code":(-?\d+|null),"signal":(null|"[A-Z0-9]{1,16}"),"timed_out":(true|false)\}\}/g,
        ),
      ];
      const exit = exits.at(-1);
      if (!exit) return;
      const pid = /"start":\{[^}]*"pid":(\d+)/.exec(head.toString('latin1'))?.[1];
      record(audit, source, 'command.exited', {
        face: 'native',
        ...(pid === undefined ? {} : { pid: Number(pid) }),
        exitCode: exit[1] === 'null' ? null : Number(exit[1]),
        ...(exit[2] === 'null' ? {} : { signal: JSON.parse(exit[2] as string) }),
        ...(exit[3] === 'true' ? { timedOut: true } : {}),
      });
    },
  };
}

/** What a row needs beyond its kind and data: the sandbox and how the request came. */
interface Source {
  id: string;
  owner: string | null;
  via: RequestTarget['via'];
}

function record(audit: AuditLog, source: Source, kind: AuditKind, data: Record<string, unknown>) {
  audit.record({
    sandboxId: source.id,
    owner: source.owner,
    actor: null,
    kind,
    data: { ...data, via: source.via },
  });
}

/** A tap that counts the body, keeps its first `keep` bytes, and calls `done` at its end. */
function tap(keep: number, done: (body: Buffer | undefined, bytes: number) => void): AuditTap {
  const kept: Buffer[] = [];
  let bytes = 0;
  let over = false;
  return {
    data(chunk) {
      bytes += chunk.length;
      if (over) return;
      if (bytes > keep) {
        over = true;
        kept.length = 0;
        return;
      }
      kept.push(Buffer.from(chunk));
    },
    count(more) {
      bytes += more;
      if (bytes > keep) {
        over = true;
        kept.length = 0;
      }
    },
    end() {
      try {
        done(over ? undefined : Buffer.concat(kept), bytes);
      } catch {
        // A body that is not what the route takes: envd refuses it; nothing is recorded.
      }
    },
  };
}

function json(body: Buffer | undefined): Record<string, unknown> | undefined {
  if (!body || body.length === 0) return undefined;
  const value = JSON.parse(body.toString('utf8')) as unknown;
  return value && typeof value === 'object' && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : undefined;
}

const text = (value: unknown): string | undefined =>
  typeof value === 'string' ? auditText(value) : undefined;

/** The names of an environment object (never its values: they may be secrets). */
const envNames = (value: unknown): string[] | undefined =>
  value && typeof value === 'object' ? Object.keys(value).slice(0, 200) : undefined;

/** The bytes a batch entry's content is, as envd will write it. */
function contentBytes(file: Record<string, unknown>): number | undefined {
  const content = file.content;
  if (typeof content !== 'string') return undefined;
  return file.encoding === 'base64'
    ? Buffer.byteLength(content, 'base64')
    : Buffer.byteLength(content, 'utf8');
}

/**
 * The tap for a request the gateway is passing to `route` (its head rewritten, about to be sent),
 * or undefined when the audit trail records nothing of it.
 */
export function gatewayAuditTap(
  audit: AuditLog,
  head: RequestHead,
  target: RequestTarget,
  route: Route,
): AuditTap | undefined {
  if (head.upgrade) return undefined;
  const source: Source = { id: route.id, owner: route.owner ?? null, via: target.via };
  const mark = target.path.indexOf('?');
  const query = new URLSearchParams(mark < 0 ? '' : target.path.slice(mark + 1));
  const { method } = head;
  const path = target.pathname.replace(/\/{2,}/g, '/');
  if (!route.envd) {
    // A command server's command, on the port it serves.
    const called = /^\/commands\/([^/]+)$/.exec(path);
    if (method !== 'POST' || !called) return undefined;
    return tap(0, (_body, bytes) =>
      record(audit, source, 'command.called', {
        port: target.port,
        name: auditText(decodeURIComponent(called[1] as string)),
        bytes,
      }),
    );
  }
  const user = target.root ? 'root' : 'user';
  if (target.e2b) {
    // E2B's uploads reach envd as bytes (its other calls are the face's: e2b-mount.ts).
    if (method !== 'POST' || path !== '/files') return undefined;
    return tap(AUDIT_BODY_KEEP, (body, bytes) => {
      const named = query.get('path');
      // Without ?path=, a multipart form names each file as its filename.
      const paths = named
        ? [named]
        : [...(body?.toString('latin1') ?? '').matchAll(/filename="([^"]*)"/g)].map(
            (m) => m[1] as string,
          );
      record(audit, source, 'file.written', {
        face: 'e2b',
        paths: paths.slice(0, 100).map(auditText),
        bytes,
        user: query.get('username') || user,
      });
    });
  }
  if (method === 'POST' && (path === '/exec' || path === '/exec/server')) {
    const started = tap(AUDIT_BODY_KEEP, (body, bytes) => {
      const request = json(body);
      record(audit, source, 'command.started', {
        face: 'native',
        ...(path === '/exec/server'
          ? { server: true, cmd: text(request?.command) }
          : request?.argv !== undefined
            ? {
                argv: Array.isArray(request.argv)
                  ? request.argv.slice(0, 200).map(String).map(auditText)
                  : undefined,
              }
            : { cmd: text(request?.cmd) }),
        ...(request?.cwd === undefined ? {} : { cwd: text(request.cwd) }),
        ...(request?.env === undefined ? {} : { env: envNames(request.env) }),
        user,
        ...(body === undefined ? { bytes, truncated: true } : {}),
      });
    });
    return path === '/exec' ? { ...started, answer: exitWatcher(audit, source) } : started;
  }
  if (method === 'PUT' && (path === '/files/write' || path === '/files/archive')) {
    return tap(0, (_body, bytes) =>
      record(audit, source, 'file.written', {
        face: 'native',
        paths: [auditText(query.get('path') ?? '')],
        bytes,
        ...(path === '/files/archive' ? { archive: true } : {}),
        user,
      }),
    );
  }
  if (method === 'POST' && path === '/files/batch') {
    return tap(BATCH_BODY_KEEP, (body, bytes) => {
      const files = json(body)?.files;
      const list = Array.isArray(files) ? (files as Record<string, unknown>[]) : [];
      record(audit, source, 'file.written', {
        face: 'native',
        paths: list.slice(0, 100).map((f) => text(f.path) ?? ''),
        sizes: list.slice(0, 100).map(contentBytes),
        bytes,
        ...(body === undefined || list.length > 100 ? { truncated: true } : {}),
        user,
      });
    });
  }
  if (method === 'POST' && (path === '/files/delete' || path === '/files/move')) {
    return tap(AUDIT_BODY_KEEP, (body) => {
      const request = json(body);
      if (path === '/files/delete') {
        record(audit, source, 'file.removed', {
          face: 'native',
          path: text(request?.path),
          recursive: request?.recursive === true,
          user,
        });
      } else {
        record(audit, source, 'file.renamed', {
          face: 'native',
          from: text(request?.from),
          to: text(request?.to),
          user,
        });
      }
    });
  }
  const tool = /^\/files\/tools\/(write|edit|delete)$/.exec(path);
  if (method === 'POST' && tool) {
    return tap(AUDIT_BODY_KEEP, (body, bytes) => {
      const request = json(body);
      const name = tool[1] as string;
      record(audit, source, name === 'delete' ? 'file.removed' : 'file.written', {
        face: 'native',
        tool: name,
        ...(name === 'delete'
          ? { path: text(request?.path ?? request?.file_path) }
          : { paths: [text(request?.path ?? request?.file_path) ?? ''], bytes }),
        user,
      });
    });
  }
  return undefined;
}

/**
 * The audit callback E2B's face is given for one request (`EnvdTarget.audit`): its process and
 * file calls are recorded where the face serves them (process-service.ts, filesystem-service.ts).
 */
export function e2bAuditCallback(
  audit: AuditLog,
  target: RequestTarget,
  route: Route,
): (kind: string, data: Record<string, unknown>) => void {
  const source: Source = { id: route.id, owner: route.owner ?? null, via: target.via };
  // The face's values are the client's: long texts and lists are cut as the gateway's own are.
  const cut = (value: unknown): unknown =>
    typeof value === 'string'
      ? auditText(value)
      : Array.isArray(value)
        ? value.slice(0, 200).map(cut)
        : value;
  return (kind, data) =>
    record(audit, source, kind as AuditKind, {
      face: 'e2b',
      ...Object.fromEntries(Object.entries(data).map(([key, value]) => [key, cut(value)])),
    });
}
