/**
 * The egress service's process: `node dist/egress.js --control SOCKET [--hosts FILE]
 * [--permit CIDR]… [--deny CIDR]… [--secrets-fd] [--ca-fd]`. The daemon starts it in the egress network namespace (its
 * own, or `--egress-netns`), and drives it over a Unix socket (which crosses namespaces):
 *
 * - `PUT /sandboxes/{id}` `{ policy }` → 201 `{ ports }`: serve a sandbox;
 * - `PUT /sandboxes/{id}/policy` `{ policy }` → 204: change its policy (new connections at once);
 * - `PUT /sandboxes/{id}/net` `{ holder, userns, adopted? }` → 204: its namespace, where DNS
 *   answers for allowed names open their addresses to raw TCP (under a policy that denies by
 *   address) and whose raw TCP egress reads for the audit trail (`adopted`: what its sets hold
 *   now was read by an earlier egress process, and is not written again);
 * - `GET /sandboxes/{id}` → `{ policy, ports, counters }` (the egress proxy without its password);
 * - `DELETE /sandboxes/{id}` → 204 (404 unknown);
 * - `GET /host-addresses` → `{ addresses }`: this namespace's own (IPv4 and IPv6), which no
 *   sandbox may dial; egress keeps each served namespace's `host4` set filled with them;
 * - `POST /egress-proxy` `{ egressProxy }` → 204, or 400 saying why egress would not dial that
 *   proxy (an always-denied or host address, a name without an address): asked before a policy
 *   with it is set, so a refusal changes nothing;
 * - `GET /audit?epoch=&after=[&harvest=ID]` → `{ epoch, rows }`: the decisions not read
 *   yet for the daemon's audit trail (audit-queue.ts), acknowledging the rows up to `after` of that
 *   epoch, and notes of what was dropped; `harvest`: that sandbox's trail is being read, so its
 *   raw TCP is read first (tcp-audit.ts) and its connections still open are written so far;
 * - `POST /sandboxes/{id}/harvest[?final=1]` → 204: its raw TCP read into the queue now (before a
 *   new policy applies; `final`: before its namespace goes away, every connection written);
 * - `GET /health` → `{ sandboxes }`.
 *
 * The other way, egress asks the daemon for secret values on fd 3 (a socket pair the daemon made,
 * never a path anyone could open), one JSON line each way: `{ id, sandbox, name }` →
 * `{ id, value }` or `{ id, missing: true }` or `{ id, error }`. The daemon decides from the
 * sandbox's owner which secret a name is; egress keeps a value only for the request it is put in.
 *
 * Errors are `{ "error": message }` with 400 (bad policy or body), 404 or 409.
 */
import { chmodSync, closeSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { LeafCertificates } from './egress-ca.js';
import { HostAddresses } from './host-addresses.js';
import {
  type EgressPolicy,
  EgressRules,
  normalizePolicy,
  PolicyError,
  parseEgressProxy,
  parsePolicy,
  publicPolicy,
} from './policy.js';
import { NameResolver } from './resolver.js';
import { ResolvedAddresses, type SandboxNet, setHostAddresses } from './sandbox-net.js';
import { type EgressPorts, EgressService } from './service.js';
import { proxyAddress } from './socks-dial.js';
import {
  type HarvestOptions,
  TCP_AUDIT_INTERVAL_MAX_MS,
  TCP_AUDIT_INTERVAL_MIN_MS,
  TCP_AUDIT_INTERVAL_MS,
  TcpAudit,
} from './tcp-audit.js';

/** Largest control request body. */
const MAX_BODY = 256 * 1024;

const { values } = parseArgs({
  options: {
    control: { type: 'string' },
    hosts: { type: 'string' },
    permit: { type: 'string', multiple: true },
    deny: { type: 'string', multiple: true },
    // fd 4 holds the CA whose certificates egress presents for hosts with rules (egress-ca.ts):
    // `{ cert, key }` as JSON, read once at start.
    'ca-fd': { type: 'boolean' },
    // fd 3 is the daemon's socket for secret values.
    'secrets-fd': { type: 'boolean' },
    // The control socket's folder is this process's own: removed when it ends.
    'owns-dir': { type: 'boolean' },
    // How often every sandbox's raw TCP is read for the audit trail (ABX_EGRESS_TCP_AUDIT_MS).
    'tcp-audit-ms': { type: 'string' },
  },
});
if (!values.control) {
  process.stderr.write(
    'usage: egress --control SOCKET [--hosts FILE] [--permit CIDR]… [--deny CIDR]…\n',
  );
  process.exit(2);
}
const control = values.control;
const tcpAuditMs = Number(values['tcp-audit-ms'] ?? TCP_AUDIT_INTERVAL_MS);
if (
  !Number.isInteger(tcpAuditMs) ||
  tcpAuditMs < TCP_AUDIT_INTERVAL_MIN_MS ||
  tcpAuditMs > TCP_AUDIT_INTERVAL_MAX_MS
) {
  process.stderr.write(
    `egress: --tcp-audit-ms must be whole milliseconds from ${TCP_AUDIT_INTERVAL_MIN_MS} to ${TCP_AUDIT_INTERVAL_MAX_MS}, not ${values['tcp-audit-ms']}\n`,
  );
  process.exit(2);
}

const policies = new Map<string, EgressPolicy>();
const nets = new Map<string, Pick<SandboxNet, 'holder' | 'userns'>>();

let refilling: Promise<unknown> = Promise.resolve();
/**
 * Refills the `host4` set of the sandboxes `ids` with the addresses as read when it runs; one
 * refill at a time, so an older list never lands after a newer one.
 */
function refillHostAddresses(ids: string[]): Promise<void> {
  const run = refilling.then(async () => {
    const list = hostAddresses.list;
    const failures: Error[] = [];
    await Promise.all(
      ids.map(async (id) => {
        const net = nets.get(id);
        if (!net) return;
        await setHostAddresses(net, list).catch((error: Error) => {
          process.stderr.write(`egress: ${id}: the host's addresses: ${error.message}\n`);
          failures.push(error);
        });
      }),
    );
    if (failures.length > 0) throw failures[0];
  });
  refilling = run.catch(() => undefined);
  return run;
}

/** This namespace's own addresses: never dialled for a sandbox (see HostAddresses). */
const hostAddresses = new HostAddresses({
  onChange: () => {
    void refillHostAddresses([...nets.keys()]).catch(() => undefined);
  },
});
hostAddresses.start();

const rules = new EgressRules({
  permit: values.permit ?? [],
  alsoDeny: (values.deny ?? []).map((cidr) => ({ cidr, what: "the daemon's own listener" })),
  hostAddresses: () => hostAddresses.current(),
});
/** Resolves egress proxies' names as the service does sandboxes' (the same hosts file first). */
const proxyResolver = new NameResolver(values.hosts ? { hostsFile: values.hosts } : {});
/** What DNS answers opened in each sandbox's namespace (its `resolved4` set). */
const resolved = new ResolvedAddresses();

/** Secret values from the daemon, over fd 3 (see above); none when no `--secrets-fd`. */
const secrets = (() => {
  if (!values['secrets-fd']) return undefined;
  const channel = new Socket({ fd: 3, readable: true, writable: true });
  channel.on('error', () => undefined);
  // A waiting request must not keep this process up once the daemon is gone (stdin ends it).
  channel.unref();
  let next = 1;
  const waiting = new Map<number, (answer: { value?: string; error?: string }) => void>();
  let buffered = '';
  channel.on('data', (chunk: Buffer) => {
    buffered += chunk.toString();
    for (let end = buffered.indexOf('\n'); end >= 0; end = buffered.indexOf('\n')) {
      const line = buffered.slice(0, end);
      buffered = buffered.slice(end + 1);
      try {
        const answer = JSON.parse(line) as { id: number; value?: string; error?: string };
        waiting.get(answer.id)?.(answer);
        waiting.delete(answer.id);
      } catch {
        // not a line of ours
      }
    }
  });
  channel.on('close', () => {
    for (const done of waiting.values()) done({ error: 'the daemon is gone' });
    waiting.clear();
  });
  return (sandbox: string, name: string): Promise<string | undefined> =>
    new Promise((resolve, reject) => {
      const id = next++;
      const timer = setTimeout(() => {
        waiting.delete(id);
        reject(new Error('the daemon did not answer within 5 s'));
      }, 5000);
      waiting.set(id, (answer) => {
        clearTimeout(timer);
        if (answer.error) reject(new Error(answer.error));
        else resolve(answer.value);
      });
      channel.write(`${JSON.stringify({ id, sandbox, name })}\n`);
    });
})();

/** Certificates for hosts with rules; none without a CA (their HTTPS is then refused). */
const certificates = (() => {
  if (!values['ca-fd']) return undefined;
  const { cert, key } = JSON.parse(readFileSync(4, 'utf8')) as { cert: string; key: string };
  closeSync(4);
  return new LeafCertificates({ cert, key });
})();

const service = new EgressService(
  rules,
  new NameResolver(values.hosts ? { hostsFile: values.hosts } : {}),
  {
    // Raw TCP to an allowed name's addresses, where only an address rule would let it out: the
    // addresses are opened (for the answer's TTL) before the sandbox reads the answer.
    onAllowedAddresses: async (id, addresses, ttl, name) => {
      tcpAudit.noteAnswer(id, name, addresses, ttl);
      const net = nets.get(id);
      if (!net || (policies.get(id)?.denyOut.length ?? 0) === 0) return undefined;
      return resolved.allow(id, net, addresses, ttl).catch((error: Error) => {
        process.stderr.write(`egress: ${id}: ${error.message}\n`);
        return undefined;
      });
    },
    // No channel (egress run by hand): every rule with a placeholder fails closed.
    resolveSecret: async (id, name) => {
      if (!secrets) throw new Error('egress has no channel to the daemon');
      return secrets(id, name);
    },
    ...(certificates ? { certificates } : {}),
  },
);

/** Raw TCP into the audit trail: each sandbox's sets, read on a timer and when asked. */
const tcpAudit = new TcpAudit(
  {
    rules,
    policy: (id) => {
      const policy = policies.get(id);
      return policy ? parsePolicy(policy) : undefined;
    },
    push: (row) => service.audit.push(row),
    dropped: (id, reason) => {
      process.stderr.write(`egress: ${id}: ${reason}\n`);
      service.audit.drop(id, reason, null);
    },
  },
  tcpAuditMs,
);

/** Reads a sandbox's raw TCP now (nothing when its namespace is not known); never throws. */
function harvest(id: string, options: HarvestOptions = {}) {
  const net = nets.get(id);
  if (!net) return Promise.resolve();
  return tcpAudit.harvest(id, net, options).catch((error: Error) => {
    process.stderr.write(`egress: ${id}: raw TCP audit: ${error.message}\n`);
  });
}

/** Every sandbox's raw TCP, one sandbox (one nft) after another, each interval. */
let harvesting = false;
const harvestTimer = setInterval(() => {
  if (harvesting) return;
  harvesting = true;
  void (async () => {
    for (const id of [...nets.keys()]) await harvest(id);
  })().finally(() => {
    harvesting = false;
  });
}, tcpAuditMs);
harvestTimer.unref();

function send(res: ServerResponse, status: number, body?: unknown): void {
  const text = body === undefined ? '' : JSON.stringify(body);
  res.writeHead(status, body === undefined ? {} : { 'content-type': 'application/json' });
  res.end(text);
}

async function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY) throw new PolicyError(`the body is over ${MAX_BODY} bytes`);
    chunks.push(chunk as Buffer);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString() || '{}');
  } catch {
    throw new PolicyError('the body is not JSON');
  }
  if (!body || typeof body !== 'object' || Array.isArray(body)) {
    throw new PolicyError('the body must be a JSON object');
  }
  return body as Record<string, unknown>;
}

function policyOf(body: Record<string, unknown>): EgressPolicy {
  const policy = (body.policy ?? {}) as Record<string, unknown>;
  if (typeof policy !== 'object' || Array.isArray(policy)) {
    throw new PolicyError('policy must be an object with allowOut and denyOut');
  }
  return normalizePolicy({
    allowOut: (policy.allowOut ?? []) as string[],
    denyOut: (policy.denyOut ?? []) as string[],
    ...(policy.rules === undefined ? {} : { rules: policy.rules as never }),
    ...(policy.egressProxy === undefined ? {} : { egressProxy: policy.egressProxy as never }),
  });
}

const server = createServer(async (req, res) => {
  try {
    const url = new URL(req.url ?? '/', 'http://egress');
    if (url.pathname === '/health') return send(res, 200, { sandboxes: service.ids().length });
    if (url.pathname === '/egress-proxy') {
      if (req.method !== 'POST') return send(res, 405, { error: 'use POST' });
      const where = 'network.egressProxy';
      const proxy = parseEgressProxy((await readJson(req)).egressProxy, where);
      if (!proxy) throw new PolicyError(`${where} must be { address, username?, password? }`);
      try {
        await proxyAddress(proxy, rules, proxyResolver);
      } catch (error) {
        throw new PolicyError(`${where}.address: ${(error as Error).message}`);
      }
      return send(res, 204);
    }
    if (url.pathname === '/audit') {
      // Its trail is being read: what is still open is written too, with what it carried so far.
      const asked = url.searchParams.get('harvest');
      if (asked) {
        await harvest(asked, { open: true });
        service.writeOpen(asked);
      }
      const after = Number(url.searchParams.get('after') ?? '0');
      return send(
        res,
        200,
        service.audit.take(
          url.searchParams.get('epoch') ?? undefined,
          Number.isSafeInteger(after) ? after : 0,
        ),
      );
    }
    if (url.pathname === '/host-addresses') {
      return send(res, 200, { addresses: [...hostAddresses.current()] });
    }
    const match = /^\/sandboxes\/([A-Za-z0-9_-]{1,64})(\/policy|\/net|\/harvest)?$/.exec(
      url.pathname,
    );
    if (!match) return send(res, 404, { error: `no route ${req.method} ${url.pathname}` });
    const id = match[1] as string;
    const known = policies.has(id);
    if (match[2] === '/net') {
      if (req.method !== 'PUT') return send(res, 405, { error: 'use PUT' });
      if (!known) return send(res, 404, { error: `sandbox ${id} is not served` });
      const body = await readJson(req);
      if (!Number.isInteger(body.holder) || typeof body.userns !== 'boolean') {
        throw new PolicyError('net must be { holder: pid, userns: boolean }');
      }
      nets.set(id, { holder: body.holder as number, userns: body.userns });
      resolved.forget(id);
      tcpAudit.forget(id);
      if (body.adopted === true) await harvest(id, { baseline: true });
      // The daemon wrote the addresses it asked for before the namespace was made: any change
      // since is filled in before the sandbox runs.
      hostAddresses.refresh();
      await refillHostAddresses([id]);
      return send(res, 204);
    }
    if (match[2] === '/harvest') {
      if (req.method !== 'POST') return send(res, 405, { error: 'use POST' });
      if (!known) return send(res, 404, { error: `sandbox ${id} is not served` });
      await harvest(id, { final: url.searchParams.get('final') === '1' });
      return send(res, 204);
    }
    if (match[2]) {
      if (req.method !== 'PUT') return send(res, 405, { error: 'use PUT' });
      if (!known) return send(res, 404, { error: `sandbox ${id} is not served` });
      const policy = policyOf(await readJson(req));
      service.setPolicy(id, policy);
      policies.set(id, policy);
      // The daemon flushed the namespace's resolved addresses with the new rules.
      resolved.forget(id);
      return send(res, 204);
    }
    if (req.method === 'PUT') {
      if (known) return send(res, 409, { error: `sandbox ${id} is already served` });
      const body = await readJson(req);
      const policy = policyOf(body);
      const wanted = body.ports as EgressPorts | undefined;
      if (
        wanted !== undefined &&
        !['http', 'tls', 'dns'].every((k) => Number.isInteger((wanted as never)[k]))
      ) {
        throw new PolicyError('ports must be { http, tls, dns }');
      }
      const ports = await service.add(id, policy, wanted);
      policies.set(id, policy);
      return send(res, 201, { ports });
    }
    if (req.method === 'GET') {
      if (!known) return send(res, 404, { error: `sandbox ${id} is not served` });
      return send(res, 200, {
        policy: publicPolicy(policies.get(id) as EgressPolicy),
        ports: service.ports(id),
        counters: service.counters(id),
      });
    }
    if (req.method === 'DELETE') {
      if (!known) return send(res, 404, { error: `sandbox ${id} is not served` });
      service.remove(id);
      policies.delete(id);
      nets.delete(id);
      resolved.forget(id);
      tcpAudit.forget(id);
      return send(res, 204);
    }
    return send(res, 405, { error: `${req.method} is not served on ${url.pathname}` });
  } catch (error) {
    if (error instanceof PolicyError) return send(res, 400, { error: error.message });
    return send(res, 500, { error: (error as Error).message });
  }
});

rmSync(control, { force: true });
server.listen(control, () => {
  chmodSync(control, 0o600);
  process.stdout.write('ready\n');
});

const stop = () => {
  clearInterval(harvestTimer);
  hostAddresses.close();
  service.close();
  server.close();
  rmSync(values['owns-dir'] ? dirname(control) : control, { recursive: true, force: true });
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
// The daemon holds our stdin: when it goes (even SIGKILLed), so do we.
process.stdin.on('end', stop);
process.stdin.resume();
