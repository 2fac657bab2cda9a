import { createHash, createHmac } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { E2bEnvdFace } from '../../src/compat/e2b/envd-face.js';
import { type AccessDecision, accessKeyParts, authorize } from '../../src/control/authorize.js';
import { ENVD_PORT, Gateway } from '../../src/control/gateway.js';
import type { RequestTarget } from '../../src/control/gateway-connection.js';
import { parseRequestHead } from '../../src/control/gateway-http.js';
import { PortLinks, SESSION_COOKIE } from '../../src/control/gateway-links.js';
import { sandboxToken } from '../../src/control/ids.js';
import type { SandboxRecord } from '../../src/control/registry.js';
import { gatewayRecord } from '../helpers/gateway-record.js';
import { type Answer, RawConnection } from '../helpers/raw-http.js';

// Every request through the gateway is authorized on its own: on a reused keep-alive connection,
// pipelined or not, a request gets exactly the answer it gets alone on a fresh connection. The
// sandboxes are fake (an echoing envd and port server on Unix sockets); the gateway, its E2B face
// and the authorization are the daemon's own.

const SECRET = 'authorization-test-secret';
const CODE_PORT = 49999;
const dir = mkdtempSync(join(tmpdir(), 'abx-authz-'));
const nowS = Math.floor(Date.now() / 1000);
const FUTURE = String(nowS + 6 * 3600);
const PAST = String(nowS - 3600);

interface Box {
  id: string;
  token: string;
  record: SandboxRecord;
}

function box(id: string, capabilities: string[], root = false): Box {
  const run = join(dir, id);
  mkdirSync(join(run, 'ports'), { recursive: true });
  const token = sandboxToken(SECRET, id);
  const record = gatewayRecord({
    id,
    token,
    envdSocket: join(run, 'envd.sock'),
    portsDir: join(run, 'ports'),
    capabilities,
    ...(root ? { envdRootSocket: join(run, 'envd-root.sock') } : {}),
  });
  return { id, token, record };
}

// A allows root (a second envd); B does not.
const A = box('iauthza', ['files', 'shell', 'code', 'ports'], true);
const B = box('iauthzb', ['files', 'shell', 'code']);
const BOXES = { a: A, b: B };

/** E2B's signed `/files` URL signature (its SDK's `downloadUrl` / `uploadUrl`). */
function sign(target: Box, path: string, operation: 'read' | 'write', expiration?: string): string {
  const raw = `${path}:${operation}:user:${target.token}${expiration === undefined ? '' : `:${expiration}`}`;
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

/** A session cookie as the gateway signs it, with any end (an ended one cannot be minted). */
function cookie(target: Box, port: number, endsAt: number): string {
  const mac = createHmac('sha256', SECRET)
    .update(`session:${target.id}:${port}:${endsAt}`)
    .digest('base64url');
  return `v1.${endsAt}.${mac}`;
}

const PUBLIC = '/home/user/public.txt';
const SECRET_FILE = '/home/user/secret.txt';

interface Signed {
  box: 'a' | 'b';
  path: string;
  operation: 'read' | 'write';
  expiration: string | undefined;
  signature: string;
}

const SIGNED: Signed[] = [];
for (const name of ['a', 'b'] as const) {
  for (const [operation, expiration] of [
    ['read', FUTURE],
    ['write', FUTURE],
    ['read', PAST],
    ['read', undefined],
  ] as const) {
    SIGNED.push({
      box: name,
      path: PUBLIC,
      operation,
      expiration,
      signature: sign(BOXES[name], PUBLIC, operation, expiration),
    });
  }
}
const SESSION_A = cookie(A, 8080, Date.now() + 6 * 3600_000);
const COOKIES = [
  SESSION_A,
  cookie(A, 3000, Date.now() + 6 * 3600_000),
  cookie(B, 8080, Date.now() + 6 * 3600_000),
  cookie(A, 8080, Date.now() - 60_000),
  'v1.1.garbage',
];
/** What a token carrier may carry: real tokens, wrong ones, and other credentials' text. */
const TOKENS = [
  A.token,
  B.token,
  'wrong-token',
  `signature ${(SIGNED[0] as Signed).signature}`,
  (SIGNED[0] as Signed).signature,
  SESSION_A,
  `session ${SESSION_A}`,
];

type Addressing = 'host' | 'headers' | 'e2b' | 'path';
type Carrier = 'header' | 'bearer' | 'query' | 'traffic' | 'cookie' | 'signature' | 'none';

interface Spec {
  box: 'a' | 'b';
  port: number;
  addressing: Addressing;
  operation: number;
  carrier: Carrier;
  credential: number;
  /** For a signature: the path the request names, and whether it keeps the expiration it was signed with. */
  secretPath: boolean;
  dropExpiration: boolean;
  /** For a signature: signed for the other sandbox than the one the request names. */
  foreign: boolean;
  /** The X-Abx-User header: none, root's envd, the user's, or a name no sandbox has. */
  user: 'none' | 'root' | 'user' | 'nobody';
}

const FIELDS: Array<keyof Spec> = [
  'box',
  'port',
  'addressing',
  'operation',
  'carrier',
  'credential',
  'secretPath',
  'dropExpiration',
  'foreign',
  'user',
];

const OPERATIONS: Array<{ method: string; path: string; body?: string; type?: string }> = [
  { method: 'GET', path: `/files?path=${encodeURIComponent(PUBLIC)}` },
  { method: 'GET', path: `/files?path=${encodeURIComponent(SECRET_FILE)}` },
  {
    method: 'POST',
    path: `/files?path=${encodeURIComponent(PUBLIC)}`,
    body: '--b\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\nhi\r\n--b--\r\n',
    type: 'multipart/form-data; boundary=b',
  },
  {
    method: 'POST',
    path: '/filesystem.Filesystem/Stat',
    body: JSON.stringify({ path: SECRET_FILE }),
    type: 'application/json',
  },
  { method: 'POST', path: '/process.Process/List', body: '{}', type: 'application/json' },
  { method: 'GET', path: '/health' },
  { method: 'GET', path: '/debug?x=1' },
  { method: 'GET', path: '/contexts' },
];

/** The request a spec describes, as bytes for the gateway. */
function request(spec: Spec): string {
  const target = BOXES[spec.box];
  const operation = OPERATIONS[spec.operation] as (typeof OPERATIONS)[number];
  let path = operation.path;
  let method = operation.method;
  const headers: string[] = [];
  const query: string[] = [];
  if (spec.carrier === 'signature') {
    const mine = spec.foreign !== (spec.box === 'a') ? 0 : SIGNED.length / 2;
    const signed = SIGNED[mine + (spec.credential % (SIGNED.length / 2))] as Signed;
    path = '/files';
    method = operation.method === 'POST' ? 'POST' : 'GET';
    query.push(`path=${encodeURIComponent(spec.secretPath ? SECRET_FILE : PUBLIC)}`);
    query.push('username=user', `signature=${encodeURIComponent(signed.signature)}`);
    if (signed.expiration !== undefined && !spec.dropExpiration) {
      query.push(`signature_expiration=${signed.expiration}`);
    }
  } else if (spec.carrier === 'cookie') {
    headers.push(`Cookie: ${SESSION_COOKIE}=${COOKIES[spec.credential % COOKIES.length]}`);
  } else if (spec.carrier !== 'none') {
    const token = TOKENS[spec.credential % TOKENS.length] as string;
    if (spec.carrier === 'header') headers.push(`X-Access-Token: ${token}`);
    if (spec.carrier === 'bearer') headers.push(`Authorization: Bearer ${token}`);
    if (spec.carrier === 'traffic') headers.push(`E2b-Traffic-Access-Token: ${token}`);
    if (spec.carrier === 'query') query.push(`token=${encodeURIComponent(token)}`);
  }
  if (query.length > 0) path += `${path.includes('?') ? '&' : '?'}${query.join('&')}`;
  if (spec.addressing === 'host') headers.push(`Host: ${spec.port}-${target.id}.localhost`);
  else headers.push('Host: 127.0.0.1');
  if (spec.addressing === 'headers') {
    headers.push(`X-Sandbox-Id: ${target.id}`, `X-Sandbox-Port: ${spec.port}`);
  }
  if (spec.addressing === 'e2b') {
    headers.push(`E2b-Sandbox-Id: ${target.id}`, `E2b-Sandbox-Port: ${spec.port}`);
  }
  if (spec.addressing === 'path') path = `/sandboxes/${target.id}/ports/${spec.port}${path}`;
  if (spec.user !== 'none') headers.push(`X-Abx-User: ${spec.user}`);
  const body = method === 'POST' ? (operation.body ?? '') : '';
  if (method === 'POST') {
    headers.push(`Content-Type: ${operation.type ?? 'application/octet-stream'}`);
    headers.push(`Content-Length: ${Buffer.byteLength(body)}`);
  }
  return `${method} ${path} HTTP/1.1\r\n${headers.join('\r\n')}\r\n\r\n${body}`;
}

const specs: fc.Arbitrary<Spec> = fc.record({
  box: fc.constantFrom<'a' | 'b'>('a', 'a', 'a', 'b'),
  port: fc.constantFrom(ENVD_PORT, ENVD_PORT, ENVD_PORT, 8080, 3000, CODE_PORT),
  addressing: fc.constantFrom<Addressing>('host', 'host', 'headers', 'e2b', 'path'),
  operation: fc.nat(OPERATIONS.length - 1),
  carrier: fc.constantFrom<Carrier>(
    'header',
    'bearer',
    'query',
    'traffic',
    'cookie',
    'signature',
    'signature',
    'none',
  ),
  credential: fc.nat(31),
  secretPath: fc.boolean(),
  dropExpiration: fc.boolean(),
  foreign: fc.boolean(),
  user: fc.constantFrom<Spec['user']>('none', 'none', 'none', 'root', 'root', 'user', 'nobody'),
});

/**
 * Sequences as an attacker sends them: most requests are the one before with one part changed
 * (another path, sandbox, port, carrier or credential), so a decision kept on the connection meets
 * the near misses it must not cover.
 */
const sequences: fc.Arbitrary<Spec[]> = fc
  .array(fc.tuple(specs, fc.nat(2 * FIELDS.length - 1)), { minLength: 2, maxLength: 7 })
  .map((drawn) => {
    const out: Spec[] = [];
    for (const [spec, change] of drawn) {
      const before = out.at(-1);
      const field = FIELDS[change];
      out.push(before && field ? { ...before, [field]: spec[field] } : spec);
    }
    return out;
  });

/** What a user sees of an answer: its status and body (not the date an echo server adds). */
const outcome = (answer: Answer) => `${answer.status} ${answer.body}`;

let gateway: Gateway;
let port: number;
const servers: Server[] = [];
/** How often the gateway asked where the daemon's API is (once per checked route to it). */
let apiLookups = 0;
const open: RawConnection[] = [];

function connection(): RawConnection {
  const made = new RawConnection(port);
  open.push(made);
  return made;
}

/** An echoing server: what reached it, with the token envd was given. */
function echo(name: string, label: string): Server {
  return createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const text = JSON.stringify({
        sandbox: name,
        server: label,
        method: req.method,
        url: req.url,
        authorization: req.headers.authorization ?? null,
      });
      res.writeHead(200, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(text),
      });
      res.end(text);
    });
  });
}

beforeAll(async () => {
  const api = echo('api', 'api');
  await new Promise<void>((resolve) => api.listen(join(dir, 'api.sock'), () => resolve()));
  servers.push(api);
  for (const target of [A, B]) {
    for (const [label, path] of [
      ['envd', target.record.handle.envdSocket as string],
      ...(target.record.handle.envdRootSocket
        ? ([['envd-root', target.record.handle.envdRootSocket]] as const)
        : []),
      ['8080', join(target.record.handle.portsDir as string, '8080.sock')],
    ] as const) {
      const server = echo(target.id, label);
      await new Promise<void>((resolve) => server.listen(path, () => resolve()));
      servers.push(server);
    }
  }
  gateway = new Gateway(
    {
      find: (id) => [A, B].find((b) => b.id === id)?.record,
      isAlive: () => true,
      openPort: async (record, _token, p) => join(record.handle.portsDir as string, `${p}.sock`),
      tokenSecret: SECRET,
      apiTarget: () => {
        apiLookups++;
        return join(dir, 'api.sock');
      },
    },
    'localhost',
    { upstreamIdle: 60_000 },
    new E2bEnvdFace(),
  );
  await new Promise<void>((resolve) => gateway.server.listen(0, '127.0.0.1', () => resolve()));
  port = (gateway.server.address() as { port: number }).port;
});

afterAll(async () => {
  for (const made of open) made.socket.destroy();
  gateway?.close();
  await new Promise<void>((resolve) => gateway?.server.close(() => resolve()));
  for (const server of servers) {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
  rmSync(dir, { recursive: true, force: true });
});

const alone = new Map<string, string>();

/** The answer `text` gets alone, on a connection of its own. */
async function answerAlone(text: string): Promise<string> {
  const known = alone.get(text);
  if (known !== undefined) return known;
  const client = connection();
  client.write(text);
  const answer = outcome(await client.answer());
  client.socket.destroy();
  alone.set(text, answer);
  return answer;
}

/**
 * The answers `texts` get on one connection, one after another or written all at once. A refusal
 * that ends the connection (one with a body) moves the rest to a new one, as a client would.
 */
async function answersTogether(texts: string[], pipelined: boolean): Promise<string[]> {
  const answers: string[] = [];
  let client = connection();
  while (answers.length < texts.length) {
    const rest = texts.slice(answers.length);
    if (pipelined) client.write(rest.join(''));
    for (const text of rest) {
      if (!pipelined) client.write(text);
      let answer: Answer;
      try {
        answer = await client.answer();
      } catch {
        break; // closed before answering it: sent again on a new connection
      }
      answers.push(outcome(answer));
      if (answer.headers.connection === 'close') break;
    }
    client.socket.destroy();
    client = connection();
  }
  client.socket.destroy();
  return answers;
}

describe('every request through the gateway is authorized on its own', () => {
  test("a signed URL used once on a connection opens nothing else there (the issue's sequence)", async () => {
    const signed = sign(A, PUBLIC, 'read', FUTURE);
    const host = `Host: ${ENVD_PORT}-${A.id}.localhost`;
    const link = (path: string, expiration = FUTURE, sig = signed) =>
      `/files?path=${encodeURIComponent(path)}&username=user&signature=${encodeURIComponent(sig)}&signature_expiration=${expiration}`;
    const client = connection();
    client.write(`GET ${link(PUBLIC)} HTTP/1.1\r\n${host}\r\n\r\n`);
    const first = await client.answer();
    expect(first.status, first.body).toBe(200);
    expect(first.json).toMatchObject({ sandbox: A.id, server: 'envd' });
    // The same signature for another file, as an upload, expired: each refused.
    client.write(`GET ${link(SECRET_FILE)} HTTP/1.1\r\n${host}\r\n\r\n`);
    expect((await client.answer()).status).toBe(401);
    client.write(
      `GET ${link(PUBLIC, PAST, sign(A, PUBLIC, 'read', PAST))} HTTP/1.1\r\n${host}\r\n\r\n`,
    );
    const expired = await client.answer();
    expect(expired.status).toBe(401);
    expect(expired.body).toContain('signature is already expired');
    const form =
      '--b\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\nhi\r\n--b--\r\n';
    client.write(
      `POST ${link(PUBLIC)} HTTP/1.1\r\n${host}\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: ${form.length}\r\n\r\n${form}`,
    );
    expect((await client.answer()).status).toBe(401);
    // The signature's text as a token, on the RPCs E2B's SDK calls: refused, and nothing reached envd.
    for (const rpc of [
      'filesystem.Filesystem/Stat',
      'process.Process/List',
      'process.Process/Start',
    ]) {
      const again = connection();
      again.write(`GET ${link(PUBLIC)} HTTP/1.1\r\n${host}\r\n\r\n`);
      expect((await again.answer()).status).toBe(200);
      const body = JSON.stringify({ path: SECRET_FILE });
      again.write(
        `POST /${rpc} HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: ${A.id}\r\nE2b-Sandbox-Port: ${ENVD_PORT}\r\nX-Access-Token: signature ${signed}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      );
      const refused = await again.answer();
      expect(refused.status, rpc).toBe(401);
    }
  });

  test("requests for the daemon's API on one connection go the route checked for the first", async () => {
    const client = connection();
    const before = apiLookups;
    for (let i = 0; i < 3; i++) {
      client.write(`GET /v1/health?n=${i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
      const answer = await client.answer();
      expect(answer.json).toMatchObject({ server: 'api', url: `/v1/health?n=${i}` });
    }
    expect(apiLookups - before).toBe(1);
  });

  test('a session cookie that ends while its connection lives is refused from then on', async () => {
    const links = new PortLinks(SECRET);
    const value = links.session(A.id, 8080, 1500);
    const head = `GET /debug HTTP/1.1\r\nHost: 8080-${A.id}.localhost\r\nCookie: ${SESSION_COOKIE}=${value}\r\n\r\n`;
    const client = connection();
    client.write(head);
    const first = await client.answer();
    expect(first.status).toBe(200);
    expect(first.json).toMatchObject({ sandbox: A.id, server: '8080' });
    await new Promise((resolve) => setTimeout(resolve, 1700));
    client.write(head);
    const later = await client.answer();
    expect(later.status).toBe(401);
    expect(later.body).toContain(SESSION_COOKIE);
  });

  test('X-Abx-User: root without a token (a session cookie, a signed URL) is refused, not ignored', async () => {
    const client = connection();
    client.write(
      `GET /files?path=${encodeURIComponent(PUBLIC)} HTTP/1.1\r\nHost: ${ENVD_PORT}-${A.id}.localhost\r\nCookie: ${SESSION_COOKIE}=${cookie(A, ENVD_PORT, Date.now() + 60_000)}\r\nX-Abx-User: root\r\n\r\n`,
    );
    const refused = await client.answer();
    expect(refused.status).toBe(400);
    expect(refused.body).toContain('X-Abx-User: root needs the sandbox');
    expect(refused.body).toContain('a dashboard session');
    const signed = SIGNED[0] as Signed;
    const query = `path=${encodeURIComponent(PUBLIC)}&username=user&signature=${encodeURIComponent(signed.signature)}${signed.expiration === undefined ? '' : `&signature_expiration=${signed.expiration}`}`;
    const again = connection();
    again.write(
      `GET /files?${query} HTTP/1.1\r\nHost: ${ENVD_PORT}-${A.id}.localhost\r\nX-Abx-User: root\r\n\r\n`,
    );
    const refusedSigned = await again.answer();
    expect(refusedSigned.status).toBe(400);
    expect(refusedSigned.body).toContain('a signed file URL');
    // Without the header, the same signed request reaches the default user's envd.
    const plain = connection();
    plain.write(`GET /files?${query} HTTP/1.1\r\nHost: ${ENVD_PORT}-${A.id}.localhost\r\n\r\n`);
    expect((await plain.answer()).status).toBe(200);
  });

  // Seeded: a failure names its seed and the shrunk sequence, and runs again the same.
  for (const pipelined of [false, true]) {
    test(`random sequences on one connection (${pipelined ? 'pipelined' : 'one at a time'}) answer as each request alone`, async () => {
      await fc.assert(
        fc.asyncProperty(sequences, async (sequence) => {
          const texts = sequence.map(request);
          const together = await answersTogether(texts, pipelined);
          for (let i = 0; i < texts.length; i++) {
            expect(together[i], texts[i]).toBe(await answerAlone(texts[i] as string));
          }
        }),
        { seed: pipelined ? 4301 : 4300, numRuns: 1500 },
      );
      // The corpus reaches every kind of answer: allowed, refused by credential, by capability.
      const statuses = new Set([...alone.values()].map((a) => a.slice(0, 3)));
      for (const status of ['200', '401', '403']) expect(statuses).toContain(status);
      const allowedBy = (carrier: string) =>
        [...alone].some(([text, answer]) => text.includes(carrier) && answer.startsWith('200'));
      for (const carrier of ['signature=', 'Cookie:', 'X-Access-Token:', 'Bearer', 'token=']) {
        expect(allowedBy(carrier), carrier).toBe(true);
      }
    }, 240_000);
  }
});

describe('the key a decision is kept under holds everything it read', () => {
  const facts = (record: SandboxRecord | undefined) => ({
    record,
    alive: true,
    now: Date.now(),
    links: new PortLinks(SECRET),
    resumes: true,
  });
  const decide = (target: RequestTarget): AccessDecision =>
    authorize(target, facts(BOXES[target.id === A.id ? 'a' : 'b'].record));
  const same = (one: AccessDecision, other: AccessDecision) =>
    one.allow === true &&
    other.allow === true &&
    one.token === other.token &&
    one.reach === other.reach &&
    one.until === other.until;

  // The targets of a corpus of requests, read as the gateway reads them.
  const corpus: RequestTarget[] = [];
  beforeAll(() => {
    const seen = new Set<string>();
    for (const spec of fc.sample(specs, { seed: 4302, numRuns: 4000 })) {
      const text = request(spec);
      if (seen.has(text)) continue;
      seen.add(text);
      const head = parseRequestHead(text.slice(0, text.indexOf('\r\n\r\n')));
      try {
        corpus.push(gateway.target(head));
      } catch {
        // refused from its head alone: decided without a sandbox, never kept
      }
    }
  });

  /** Two targets whose keys (under `key`) are equal, one allowed, the other not decided alike. */
  function conflict(key: (target: RequestTarget) => string | undefined) {
    const groups = new Map<string, Array<{ target: RequestTarget; decision: AccessDecision }>>();
    for (const target of corpus) {
      const k = key(target);
      if (k === undefined) continue;
      const group = groups.get(k) ?? [];
      group.push({ target, decision: decide(target) });
      groups.set(k, group);
    }
    for (const group of groups.values()) {
      const allowed = group.find((one) => one.decision.allow === true);
      const other = allowed && group.find((one) => !same(allowed.decision, one.decision));
      if (allowed && other) return { allowed, other };
    }
    return undefined;
  }

  test('requests that share a key are decided alike', () => {
    const keyed = corpus.filter((t) => accessKeyParts(t) !== undefined);
    expect(keyed.length).toBeGreaterThan(200);
    expect(conflict((t) => JSON.stringify(accessKeyParts(t)))).toBeUndefined();
  });

  test('without any one part of the key, two requests would share a decision they must not', () => {
    const parts = accessKeyParts(
      corpus.find((t) => accessKeyParts(t)?.[0] === 'token') as RequestTarget,
    );
    for (let drop = 0; drop < (parts?.length ?? 0); drop++) {
      const found = conflict((t) => {
        const all = accessKeyParts(t);
        return all === undefined ? undefined : JSON.stringify(all.filter((_, i) => i !== drop));
      });
      expect(found, `the key without part ${drop}`).toBeDefined();
    }
  });
});
