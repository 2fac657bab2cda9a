import { Code, ConnectError, createConnectRouter, createContextValues } from '@connectrpc/connect';
import type { UniversalHandler } from '@connectrpc/connect/protocol';
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import {
  type ServerStreamImpl,
  type StreamAnswer,
  serverStreamHandler,
  type UnaryImpl,
  unaryHandler,
} from '../../../src/compat/e2b/connect-stream.js';
import { Filesystem, FileType } from '../../../src/compat/e2b/gen/filesystem/filesystem_pb.js';
import { Process } from '../../../src/compat/e2b/gen/process/process_pb.js';

// The E2B face answers server-streaming calls of E2B's usual shape itself (connect-stream.ts) and
// hands every other request to connect's own handler. Both are held here to the same answers,
// byte for byte: the same implementation behind each, the requests an SDK sends, and fuzzed ones
// (fixed seed). Wherever the fast path answers, connect's handler must answer the same.
const SEED = 20261203;
/** Mostly `value` (what an SDK sends), sometimes one of `others`. */
const usual = <T>(value: T, ...others: T[]) =>
  fc.oneof({ arbitrary: fc.constant(value), weight: 5 }, fc.constantFrom(...others));
const OPTIONS = { grpc: false, grpcWeb: false, acceptCompression: [], readMaxBytes: 64 * 1024 };

/** What each scenario observed of its context, for the tests that look at the call's end. */
const seen = { finallyRan: 0, signal: undefined as AbortSignal | undefined };

/**
 * A `process.Process/Start` whose behaviour the request's `cmd` names: `yield` N events, `fail`
 * with a Connect error before or after some events, `crash` with a plain Error, set headers and
 * trailers, or wait for the deadline.
 */
const start = async function* (
  request: { process?: { cmd: string; args: string[] } },
  context: Parameters<ServerStreamImpl>[1],
) {
  const [what = '', count = '0'] = (request.process?.cmd ?? '').split(':');
  const n = Math.min(Number(count) || 0, 20);
  seen.signal = context.signal;
  try {
    if (what === 'header') {
      context.responseHeader.set('x-scenario', 'header');
      context.responseTrailer.set('x-trailer', request.process?.args.join(',') ?? '');
    }
    if (what === 'deadline' || what === 'wait') {
      await new Promise((resolve) => {
        if (context.signal.aborted) resolve(undefined);
        context.signal.addEventListener('abort', resolve, { once: true });
      });
      throw context.signal.reason;
    }
    for (let i = 0; i < n; i++) {
      yield {
        $typeName: 'process.StartResponse' as const,
        event: {
          $typeName: 'process.ProcessEvent' as const,
          event:
            i === 0
              ? {
                  case: 'start' as const,
                  value: { $typeName: 'process.ProcessEvent.StartEvent' as const, pid: 7 + i },
                }
              : {
                  case: 'data' as const,
                  value: {
                    $typeName: 'process.ProcessEvent.DataEvent' as const,
                    output: {
                      case: 'stdout' as const,
                      value: Buffer.from(request.process?.args[i % 3] ?? `line ${i}\n`),
                    },
                  },
                },
        },
      };
    }
    if (what === 'fail') {
      throw new ConnectError(`failed after ${n}: ${request.process?.args[0] ?? ''}`, Code.NotFound);
    }
    if (what === 'crash') throw new Error(`crashed after ${n}`);
  } finally {
    seen.finallyRan++;
  }
};

const router = createConnectRouter(OPTIONS);
router.service(Process, { start: start as never });
const connectHandler = router.handlers.find(
  (h) => h.requestPath === '/process.Process/Start',
) as UniversalHandler;
const fast = serverStreamHandler(
  Process.method.start,
  start as unknown as ServerStreamImpl,
  OPTIONS,
);

interface Request {
  method: string;
  headers: Record<string, string>;
  body: Uint8Array;
}

async function bytesOf(body: AsyncIterable<Uint8Array> | Uint8Array | undefined) {
  if (body === undefined) return Buffer.alloc(0);
  if (body instanceof Uint8Array) return Buffer.from(body);
  const pieces: Buffer[] = [];
  for await (const piece of body) pieces.push(Buffer.from(piece));
  return Buffer.concat(pieces);
}

function headerList(headers: Headers): string[] {
  return [...headers.entries()].map(([k, v]) => `${k}: ${v}`).sort();
}

async function viaConnect(request: Request) {
  const answer = await connectHandler({
    httpVersion: '1.1',
    url: 'http://envd/process.Process/Start',
    method: request.method,
    header: new Headers(request.headers),
    body: (async function* () {
      if (request.body.length > 0) yield request.body;
    })(),
    signal: new AbortController().signal,
    contextValues: createContextValues(),
  });
  return {
    status: answer.status,
    headers: headerList(new Headers(answer.header)),
    body: await bytesOf(answer.body),
  };
}

async function viaFast(request: Request) {
  const answer: StreamAnswer | undefined = await fast({
    method: request.method,
    url: 'http://envd/process.Process/Start',
    header: new Headers(request.headers),
    body: request.body,
    signal: new AbortController().signal,
    contextValues: createContextValues(),
  });
  if (!answer) return undefined;
  return {
    status: answer.status,
    headers: headerList(answer.headers),
    body: await bytesOf(answer.body),
  };
}

function envelope(flags: number, json: string): Uint8Array {
  const data = Buffer.from(json);
  const bytes = Buffer.alloc(5 + data.length);
  bytes[0] = flags;
  bytes.writeUInt32BE(data.length, 1);
  data.copy(bytes, 5);
  return bytes;
}

/** A request as E2B's SDK sends it (connect-web's JSON codec). */
function sdkRequest(message: unknown, headers: Record<string, string> = {}): Request {
  return {
    method: 'POST',
    headers: {
      'content-type': 'application/connect+json',
      'connect-protocol-version': '1',
      'connect-timeout-ms': '60000',
      ...headers,
    },
    body: envelope(0, JSON.stringify(message)),
  };
}

/** The end-stream message of an answer (its last envelope), parsed. */
function endStreamOf(body: Buffer): { error?: { code: string; message: string } } {
  let at = 0;
  let last: { flags: number; data: Buffer } | undefined;
  while (at + 5 <= body.length) {
    const length = body.readUInt32BE(at + 1);
    last = { flags: body[at] as number, data: body.subarray(at + 5, at + 5 + length) };
    at += 5 + length;
  }
  expect(last?.flags).toBe(2);
  return JSON.parse(String(last?.data));
}

describe("the E2B face's server streams answer as connect's handler does", () => {
  const scenarios: [string, unknown][] = [
    ['events', { process: { cmd: 'yield:5', args: ['a\n', 'b', '\u00e9\u0000x'] } }],
    ['no events', { process: { cmd: 'yield:0' } }],
    ['an error first', { process: { cmd: 'fail:0', args: ['no such pid'] } }],
    ['an error after events', { process: { cmd: 'fail:3', args: ['gone'] } }],
    ['a plain Error (internal)', { process: { cmd: 'crash:2' } }],
    ['headers and trailers', { process: { cmd: 'header:2', args: ['t1', 't2'] } }],
    ['unknown fields are ignored', { process: { cmd: 'yield:1' }, extra: 1, stdin: false }],
    ['an empty message', {}],
  ];
  for (const [name, message] of scenarios) {
    test(name, async () => {
      const request = sdkRequest(message);
      const ours = await viaFast(request);
      // Each of these is E2B's shape: the fast path answers it, exactly as connect does.
      expect(ours).toBeDefined();
      expect(ours).toEqual(await viaConnect(request));
    });
  }

  test('a deadline (Connect-Timeout-Ms) ends the stream with deadline_exceeded', async () => {
    const request = sdkRequest({ process: { cmd: 'deadline' } }, { 'connect-timeout-ms': '5' });
    const ours = await viaFast(request);
    expect(ours).toEqual(await viaConnect(request));
    expect(endStreamOf((ours as { body: Buffer }).body).error?.code).toBe('deadline_exceeded');
  });

  test('requests of other shapes are left to connect, which answers their errors', async () => {
    const valid = sdkRequest({ process: { cmd: 'yield:1' } });
    const others: Request[] = [
      { ...valid, method: 'GET' },
      { ...valid, headers: { ...valid.headers, 'content-type': 'application/connect+proto' } },
      { ...valid, headers: { ...valid.headers, 'content-type': 'application/json' } },
      { ...valid, headers: { ...valid.headers, 'connect-content-encoding': 'gzip' } },
      { ...valid, headers: { ...valid.headers, 'connect-timeout-ms': 'soon' } },
      { ...valid, body: envelope(1, '{}') },
      { ...valid, body: envelope(2, '{}') },
      { ...valid, body: Buffer.concat([envelope(0, '{}'), envelope(0, '{}')]) },
      { ...valid, body: envelope(0, '{"process": 5}') },
      { ...valid, body: envelope(0, 'not json') },
      { ...valid, body: valid.body.subarray(0, 7) },
      { ...valid, body: new Uint8Array(0) },
    ];
    for (const request of others) {
      expect(await viaFast(request)).toBeUndefined();
      // connect answers each with its own error (a status, or an end-stream error).
      const theirs = await viaConnect(request);
      if (theirs.status === 200) expect(endStreamOf(theirs.body).error).toBeDefined();
      else expect(theirs.status).toBeGreaterThanOrEqual(400);
    }
  });

  test('fuzzed requests: wherever the fast path answers, connect answers the same', async () => {
    let answered = 0;
    const cmd = fc.oneof(
      fc.constantFrom('yield:0', 'yield:1', 'yield:4', 'fail:0', 'fail:2', 'crash:1', 'header:1'),
      fc.string({ maxLength: 12 }),
    );
    const message = fc.record(
      {
        process: fc.record(
          { cmd, args: fc.array(fc.string({ maxLength: 8 }), { maxLength: 4 }) },
          { requiredKeys: [] },
        ),
        stdin: fc.boolean(),
        tag: fc.string({ maxLength: 4 }),
      },
      { requiredKeys: [] },
    );
    // Weighted toward E2B's shape, so that most runs compare real answers.
    const body = fc.oneof(
      { arbitrary: message.map((m) => envelope(0, JSON.stringify(m))), weight: 6 },
      fc.tuple(fc.integer({ min: 0, max: 3 }), fc.json()).map(([f, j]) => envelope(f, j)),
      fc.uint8Array({ maxLength: 40 }),
    );
    const headers = fc.record(
      {
        'content-type': usual(
          'application/connect+json',
          'application/connect+json; charset=utf-8',
          'application/connect+proto',
          'application/json',
          'text/plain',
        ),
        'connect-protocol-version': usual('1', '2'),
        'connect-timeout-ms': usual('60000', '1', '0', '-1', 'x', '99999999999'),
        'connect-content-encoding': usual('identity', 'gzip', 'br'),
      },
      { requiredKeys: ['content-type'] },
    );
    await fc.assert(
      fc.asyncProperty(usual('POST', 'PUT', 'GET'), headers, body, async (m, h, b) => {
        const request = { method: m, headers: h, body: b };
        const ours = await viaFast(request);
        if (!ours) return;
        answered++;
        // A 1 ms deadline may pass in either handler before the first message: not compared.
        if (h['connect-timeout-ms'] === '1') return;
        expect(ours).toEqual(await viaConnect(request));
      }),
      { numRuns: 300, seed: SEED },
    );
    // The property compared real answers, not only refusals.
    expect(answered).toBeGreaterThan(50);
  });

  test('a client that stops reading stops the implementation and aborts its signal', async () => {
    const before = seen.finallyRan;
    const answer = (await fast({
      method: 'POST',
      url: 'http://envd/process.Process/Start',
      header: new Headers(sdkRequest({}).headers),
      body: sdkRequest({ process: { cmd: 'yield:10' } }).body,
      signal: new AbortController().signal,
      contextValues: createContextValues(),
    })) as StreamAnswer;
    const iterator = answer.body[Symbol.asyncIterator]();
    expect((await iterator.next()).done).toBe(false);
    expect(seen.signal?.aborted).toBe(false);
    await iterator.return?.();
    expect(seen.finallyRan).toBe(before + 1);
    expect(seen.signal?.aborted).toBe(true);
  });

  test("the request's signal (the client went away) ends a waiting call", async () => {
    const client = new AbortController();
    const answer = fast({
      method: 'POST',
      url: 'http://envd/process.Process/Start',
      header: new Headers(sdkRequest({}).headers),
      body: sdkRequest({ process: { cmd: 'wait' } }).body,
      signal: client.signal,
      contextValues: createContextValues(),
    });
    client.abort(new Error('client gone'));
    const body = await bytesOf(((await answer) as StreamAnswer).body);
    // connect's handler ends such a call the same way: an internal error naming no detail.
    expect(endStreamOf(body).error?.code).toBe('internal');
  });
});

// The same for unary calls (`unaryHandler`): a `filesystem.Filesystem/Stat` whose behaviour the
// request's `path` names.
const stat = async (request: { path?: string }, context: Parameters<UnaryImpl>[1]) => {
  const [what = '', detail = ''] = (request.path ?? '').split(':');
  if (what === 'fail') throw new ConnectError(`no such path: ${detail}`, Code.NotFound);
  if (what === 'crash') throw new Error(`crashed: ${detail}`);
  if (what === 'metadata') {
    throw new ConnectError('refused', Code.PermissionDenied, { 'x-why': detail });
  }
  if (what === 'deadline') {
    await new Promise((resolve) => {
      if (context.signal.aborted) resolve(undefined);
      context.signal.addEventListener('abort', resolve, { once: true });
    });
    throw context.signal.reason;
  }
  if (what === 'header') {
    context.responseHeader.set('x-scenario', 'header');
    context.responseTrailer.set('x-trailer', detail);
  }
  return {
    entry: {
      name: detail || 'a.txt',
      type: FileType.FILE,
      path: `/home/user/${detail}`,
      size: BigInt(detail.length),
      mode: 0o644,
      permissions: '-rw-r--r--',
      owner: 'user',
      group: 'user',
      metadata: what === 'meta' ? { k: detail } : {},
    },
  };
};

const statRouter = createConnectRouter(OPTIONS);
statRouter.service(Filesystem, { stat: stat as never });
const connectStat = statRouter.handlers.find(
  (h) => h.requestPath === '/filesystem.Filesystem/Stat',
) as UniversalHandler;
const fastStat = unaryHandler(Filesystem.method.stat, stat as unknown as UnaryImpl, OPTIONS);

async function statVia(which: 'connect' | 'fast', request: Request) {
  const call = {
    method: request.method,
    url: 'http://envd/filesystem.Filesystem/Stat',
    header: new Headers(request.headers),
    signal: new AbortController().signal,
    contextValues: createContextValues(),
  };
  if (which === 'fast') {
    const answer = await fastStat({ ...call, body: request.body });
    if (!answer) return undefined;
    return {
      status: answer.status,
      headers: headerList(answer.headers),
      body: Buffer.from(answer.body),
    };
  }
  const answer = await connectStat({
    ...call,
    httpVersion: '1.1',
    body: (async function* () {
      if (request.body.length > 0) yield request.body;
    })(),
  });
  return {
    status: answer.status,
    headers: headerList(new Headers(answer.header)),
    body: await bytesOf(answer.body),
  };
}

/** A unary request as E2B's SDK sends it. */
function unaryRequest(message: unknown, headers: Record<string, string> = {}): Request {
  return {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'connect-protocol-version': '1',
      'connect-timeout-ms': '60000',
      ...headers,
    },
    body: Buffer.from(JSON.stringify(message)),
  };
}

describe("the E2B face's unary calls answer as connect's handler does", () => {
  const scenarios: [string, unknown][] = [
    ['an answer', { path: 'ok:notes.txt' }],
    ['non-ASCII and metadata', { path: 'meta:caf\u00e9 \u0000x' }],
    ['a Connect error', { path: 'fail:/nowhere' }],
    ['a Connect error with metadata', { path: 'metadata:because' }],
    ['a plain Error (internal)', { path: 'crash:boom' }],
    ['headers and trailers', { path: 'header:t1' }],
    ['unknown fields are ignored', { path: 'ok:x', extra: [1, 2] }],
    ['an empty message', {}],
  ];
  for (const [name, message] of scenarios) {
    test(name, async () => {
      const request = unaryRequest(message);
      const ours = await statVia('fast', request);
      expect(ours).toBeDefined();
      expect(ours).toEqual(await statVia('connect', request));
    });
  }

  test('a deadline (Connect-Timeout-Ms) ends the call with deadline_exceeded', async () => {
    const request = unaryRequest({ path: 'deadline' }, { 'connect-timeout-ms': '5' });
    const ours = await statVia('fast', request);
    expect(ours).toEqual(await statVia('connect', request));
    expect(ours?.status).toBe(504);
    expect(JSON.parse(String(ours?.body)).code).toBe('deadline_exceeded');
  });

  test('requests of other shapes are left to connect, which answers their errors', async () => {
    const valid = unaryRequest({ path: 'ok:a' });
    const others: Request[] = [
      { ...valid, method: 'GET' },
      { ...valid, headers: { ...valid.headers, 'content-type': 'application/proto' } },
      { ...valid, headers: { ...valid.headers, 'content-type': 'application/connect+json' } },
      { ...valid, headers: { ...valid.headers, 'content-encoding': 'gzip' } },
      { ...valid, headers: { ...valid.headers, 'connect-timeout-ms': 'soon' } },
      { ...valid, body: Buffer.from('{"path": 5}') },
      { ...valid, body: Buffer.from('not json') },
      { ...valid, body: Buffer.alloc(OPTIONS.readMaxBytes + 1, 32) },
    ];
    for (const request of others) {
      expect(await statVia('fast', request)).toBeUndefined();
      expect((await statVia('connect', request))?.status).toBeGreaterThanOrEqual(400);
    }
  });

  test('fuzzed requests: wherever the fast path answers, connect answers the same', async () => {
    let answered = 0;
    const path = fc.oneof(
      fc.constantFrom('ok:a', 'meta:b', 'fail:c', 'metadata:d', 'crash:e', 'header:f'),
      fc.string({ maxLength: 12 }),
    );
    const message = fc.record({ path, tag: fc.string({ maxLength: 4 }) }, { requiredKeys: [] });
    const body = fc.oneof(
      { arbitrary: message.map((m) => Buffer.from(JSON.stringify(m))), weight: 6 },
      fc.json().map((j) => Buffer.from(j)),
      fc.uint8Array({ maxLength: 40 }),
    );
    const headers = fc.record(
      {
        'content-type': usual(
          'application/json',
          'application/json; charset=utf-8',
          'application/proto',
          'application/connect+json',
          'text/plain',
        ),
        'connect-protocol-version': usual('1', '2'),
        'connect-timeout-ms': usual('60000', '0', '-1', 'x', '99999999999'),
        'content-encoding': usual('identity', 'gzip', 'br'),
      },
      { requiredKeys: ['content-type'] },
    );
    await fc.assert(
      fc.asyncProperty(usual('POST', 'PUT', 'GET'), headers, body, async (m, h, b) => {
        const request = { method: m, headers: h, body: b };
        const ours = await statVia('fast', request);
        if (!ours) return;
        answered++;
        expect(ours).toEqual(await statVia('connect', request));
      }),
      { numRuns: 300, seed: SEED },
    );
    expect(answered).toBeGreaterThan(50);
  });
});
