import { expect } from 'vitest';
import type { Json } from '../helpers/api-call.js';

/** An open `GET /v1/events` stream: the lifecycle events it sent so far. */
export interface EventStream {
  events: { id: number; event: Json }[];
  /** Text of every other event (the dashboard's). */
  others: string[];
  close(): Promise<void>;
}

/** Opens `GET /v1/events{query}` as server-sent events with `key`, reading it until closed. */
export async function openEventStream(
  apiUrl: string,
  key: string,
  query: string,
  headers: Record<string, string> = {},
): Promise<EventStream> {
  const controller = new AbortController();
  const response = await fetch(`${apiUrl}/v1/events${query}`, {
    headers: { authorization: `Bearer ${key}`, accept: 'text/event-stream', ...headers },
    signal: controller.signal,
  });
  expect(response.status).toBe(200);
  const out: EventStream = {
    events: [],
    others: [],
    close: async () => {
      controller.abort();
      await reading;
    },
  };
  const reading = (async () => {
    const decoder = new TextDecoder();
    let buffer = '';
    try {
      for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
        buffer += decoder.decode(chunk, { stream: true });
        for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const event = /^event: (.+)$/m.exec(block)?.[1];
          const data = /^data: (.+)$/m.exec(block)?.[1];
          const id = /^id: (.+)$/m.exec(block)?.[1];
          if (event === 'lifecycle' && data && id) {
            out.events.push({ id: Number(id), event: JSON.parse(data) });
          } else if (event) out.others.push(event);
        }
      }
    } catch {
      // aborted by close()
    }
  })();
  return out;
}
