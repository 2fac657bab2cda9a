import { type Agent, request } from 'node:http';

/** What a raw request got back. */
export interface RawAnswer {
  status: number;
  /** The status line's text (E2B's code interpreter puts its message there too). */
  reason: string;
  type: string | undefined;
  body: Buffer;
  /** It went over a kept-alive connection of `agent`. */
  reused: boolean;
}

/**
 * One request to `base` (the daemon's gateway) over node:http, written exactly as given: the
 * E2B tests' way to send what the SDKs would not (broken envelopes, wrong types, odd headers).
 */
export function rawRequest(
  base: string,
  options: {
    method: string;
    path: string;
    headers: Record<string, string>;
    body?: Buffer | string | undefined;
    agent?: Agent | false;
  },
): Promise<RawAnswer> {
  const url = new URL(base);
  const payload = typeof options.body === 'string' ? Buffer.from(options.body) : options.body;
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: url.hostname,
        port: url.port,
        method: options.method,
        path: options.path,
        agent: options.agent ?? false,
        timeout: 60_000,
        headers: {
          ...(payload ? { 'content-length': String(payload.length) } : {}),
          ...options.headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            reason: res.statusMessage ?? '',
            type: res.headers['content-type'],
            body: Buffer.concat(chunks),
            reused: req.reusedSocket,
          }),
        );
      },
    );
    req.on('timeout', () => req.destroy(new Error(`no answer to ${options.path} within 60 s`)));
    req.on('error', reject);
    req.end(payload);
  });
}
