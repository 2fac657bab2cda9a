import { request } from 'undici';
import { test as base } from 'vitest';
import { EXEC } from '../../runtime/envd/exec.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { PROCESS } from '../../runtime/server/groups/process.js';
import { SandboxServer } from '../../runtime/server/server.js';
import { type Answer, type CallOptions, call } from '../server/harness.js';

// biome-ignore lint/suspicious/noExplicitAny: events are checked field by field
export type Event = any;

/** envd's process routes served in-process on loopback, with a client for them. */
export interface EnvdUnderTest {
  call(path: string, options?: CallOptions): Promise<Answer>;
  /** Opens an NDJSON route; its events one by one, as they arrive. */
  open(path: string, body?: unknown, signal?: AbortSignal): Promise<AsyncIterator<Event>>;
  /** Every event of an NDJSON route, until the server ends the answer. */
  events(path: string, body?: unknown): Promise<Event[]>;
}

const TOKEN = 'envd-test-token';

/** The parsed lines of an NDJSON body; a stream that ends inside a line is an error. */
export async function* lines(body: AsyncIterable<Buffer>): AsyncGenerator<Event> {
  let pending = '';
  for await (const chunk of body) {
    pending += chunk.toString('utf8');
    const parts = pending.split('\n');
    pending = parts.pop() ?? '';
    for (const part of parts) yield JSON.parse(part);
  }
  if (pending !== '') throw new Error(`the stream ended inside a line: ${pending}`);
}

/**
 * A vitest `test` with an `envd` fixture: a SandboxServer with envd's process groups, stopped
 * after each test (which kills every process the test started), even when the test fails.
 */
export const test = base.extend<{ envd: EnvdUnderTest }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  envd: async ({}, use) => {
    const server = new SandboxServer({ token: TOKEN, catalog: [CORE, PROCESS, EXEC] });
    const { host, port } = await server.start();
    const url = `http://${host}:${port}`;
    const open = async (path: string, body?: unknown, signal?: AbortSignal) => {
      const response = await request(`${url}${path}`, {
        method: body === undefined ? 'GET' : 'POST',
        headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
        ...(signal ? { signal } : {}),
      });
      if (response.statusCode !== 200) {
        throw new Error(`${path} answered ${response.statusCode}: ${await response.body.text()}`);
      }
      return lines(response.body)[Symbol.asyncIterator]();
    };
    try {
      await use({
        call: (path, options = {}) => call(url, path, { token: TOKEN, ...options }),
        open,
        events: async (path, body) => {
          const all: Event[] = [];
          const iterator = await open(path, body);
          for (let next = await iterator.next(); !next.done; next = await iterator.next()) {
            all.push(next.value);
          }
          return all;
        },
      });
    } finally {
      await server.stop();
    }
  },
});

/** The text of one stream, from output events. */
export function textOf(events: readonly Event[], stream: 'stdout' | 'stderr'): string {
  return events
    .filter((e) => e.stream === stream && 'data' in e)
    .map((e) => e.data)
    .join('');
}
