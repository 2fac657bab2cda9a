import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { Daemon } from '../../src/control/daemon.js';
import { type EgressPolicy, withoutInternet } from '../../src/egress/policy.js';
import { InvalidArgumentError, SandboxStartError, UnavailableError } from '../../src/errors.js';
import {
  egressNetworkPolicy,
  permittedRanges,
} from '../../src/providers/kubernetes/network-policy.js';
import { podName, sandboxesHash, sandboxPod } from '../../src/providers/kubernetes/pod-spec.js';
import type { SandboxHandle, SandboxSpec } from '../../src/providers/provider.js';
import { call } from '../helpers/api-call.js';
import { ROOT } from '../helpers/build.js';
import { type KubeApiDouble, networkPolicyRules } from '../helpers/kube-api-double.js';
import { kubeDoubles, NAMESPACE, RUNTIME_IMAGE } from '../helpers/kube-fixture.js';
import { readmeBlocks } from '../helpers/readme.js';

// The internet network on the Kubernetes provider: a NetworkPolicy per sandbox. No cluster runs
// here and the API double's pods share the host's network (no CNI enforces anything), so these
// tests read the objects the provider made, as a cluster admin would with kubectl, and the
// double refuses any that the API server would (kubernetes-models' schema and the API server's
// own ipBlock and port rules).

/** What a cluster admin reads in a policy's egress rules. */
const DNS_RULE = {
  to: [
    {
      namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'kube-system' } },
      podSelector: { matchLabels: { 'k8s-app': 'kube-dns' } },
    },
  ],
  ports: [
    { protocol: 'UDP', port: 53 },
    { protocol: 'TCP', port: 53 },
  ],
};
const ALWAYS_V4 = [
  '127.0.0.0/8',
  '0.0.0.0/8',
  '169.254.0.0/16',
  '10.0.0.0/8',
  '172.16.0.0/12',
  '192.168.0.0/16',
  '100.64.0.0/10',
  '224.0.0.0/4',
  '255.255.255.255/32',
];
const ALWAYS_V6 = ['::1/128', '::/128', 'fe80::/10', 'fc00::/7', 'ff00::/8', '::ffff:0:0/96'];
/** The TCP rule of a policy whose ranges are `blocks`. */
const tcpTo = (...blocks: object[]) => ({
  to: blocks.map((ipBlock) => ({ ipBlock })),
  ports: [{ protocol: 'TCP' }],
});

/** The policy object of `policy`, checked as the API server would check it. */
function policyOf(policy: EgressPolicy, permit: string[] = []) {
  const object = egressNetworkPolicy('i123', policy, {
    namespace: NAMESPACE,
    sandboxesHash: '0123456789abcdef',
    permit: permittedRanges(permit),
  });
  expect(() =>
    new NetworkPolicy(object as ConstructorParameters<typeof NetworkPolicy>[0]).validate(),
  ).not.toThrow();
  expect(networkPolicyRules(object as never)).toBeUndefined();
  return object;
}

describe("an internet sandbox's NetworkPolicy, as a cluster admin reads it", () => {
  test('it selects the sandbox’s pod alone, isolates its egress, and lets DNS go to the cluster DNS only', () => {
    const object = policyOf({ allowOut: [], denyOut: [] });
    expect(object.metadata).toEqual({
      name: 'abx-i123-egress',
      namespace: NAMESPACE,
      labels: {
        'abx.dev/managed-by': 'abx',
        'abx.dev/sandbox-id': 'i123',
        'abx.dev/sandboxes': '0123456789abcdef',
      },
    });
    expect(object.spec?.podSelector).toEqual({ matchLabels: { 'abx.dev/sandbox-id': 'i123' } });
    expect(object.spec?.policyTypes).toEqual(['Egress']);
    // No policy: every public address over TCP, IPv4 and IPv6, never the always-denied ranges.
    expect(object.spec?.egress).toEqual([
      DNS_RULE,
      tcpTo({ cidr: '0.0.0.0/0', except: ALWAYS_V4 }, { cidr: '::/0', except: ALWAYS_V6 }),
    ]);
  });

  test('deny entries are excepted; an allow entry is a range of its own, so it wins over a deny entry', () => {
    expect(
      policyOf({ allowOut: [], denyOut: ['203.0.113.0/24', '2001:db8::/32'] }).spec?.egress,
    ).toEqual([
      DNS_RULE,
      tcpTo(
        { cidr: '0.0.0.0/0', except: [...ALWAYS_V4, '203.0.113.0/24'] },
        { cidr: '::/0', except: [...ALWAYS_V6, '2001:db8::/32'] },
      ),
    ]);
    expect(
      policyOf({ allowOut: ['203.0.113.7', '2001:db8::1'], denyOut: ['203.0.113.0/24', '::/0'] })
        .spec?.egress,
    ).toEqual([
      DNS_RULE,
      tcpTo(
        { cidr: '0.0.0.0/0', except: [...ALWAYS_V4, '203.0.113.0/24'] },
        { cidr: '203.0.113.7/32' },
        { cidr: '2001:db8::1/128' },
      ),
    ]);
  });

  test('allowInternetAccess false: nothing but DNS and the allow list', () => {
    expect(policyOf(withoutInternet({ allowOut: [], denyOut: [] })).spec?.egress).toEqual([
      DNS_RULE,
    ]);
    expect(
      policyOf(withoutInternet({ allowOut: ['198.51.100.0/24'], denyOut: [] })).spec?.egress,
    ).toEqual([DNS_RULE, tcpTo({ cidr: '198.51.100.0/24' })]);
  });

  test('an allow entry never opens an always-denied range: the cloud metadata address, RFC 1918, loopback', () => {
    expect(
      policyOf({
        allowOut: ['169.254.169.254', '10.1.0.0/16', '127.0.0.1', 'fd00::/8'],
        denyOut: ['0.0.0.0/0', '::/0'],
      }).spec?.egress,
    ).toEqual([DNS_RULE]);
    // A wide allow entry keeps them excepted.
    expect(
      policyOf({ allowOut: ['0.0.0.0/0'], denyOut: ['0.0.0.0/0', '::/0'] }).spec?.egress,
    ).toEqual([DNS_RULE, tcpTo({ cidr: '0.0.0.0/0', except: ALWAYS_V4 })]);
  });

  test('ranges the operator permits (ABX_EGRESS_PERMIT) are not excepted, and the lists apply in them', () => {
    const permit = ['10.20.0.0/16'];
    expect(policyOf({ allowOut: [], denyOut: [] }, permit).spec?.egress).toEqual([
      DNS_RULE,
      tcpTo(
        { cidr: '0.0.0.0/0', except: ALWAYS_V4 },
        { cidr: '10.20.0.0/16' },
        { cidr: '::/0', except: ALWAYS_V6 },
      ),
    ]);
    expect(policyOf({ allowOut: [], denyOut: ['10.20.5.0/24'] }, permit).spec?.egress).toEqual([
      DNS_RULE,
      tcpTo(
        { cidr: '0.0.0.0/0', except: ALWAYS_V4 },
        { cidr: '10.20.0.0/16', except: ['10.20.5.0/24'] },
        { cidr: '::/0', except: ALWAYS_V6 },
      ),
    ]);
    // Deny all, allow 10.0.0.0/8: only its permitted part opens.
    expect(
      policyOf({ allowOut: ['10.0.0.0/8'], denyOut: ['0.0.0.0/0', '::/0'] }, permit).spec?.egress,
    ).toEqual([DNS_RULE, tcpTo({ cidr: '10.20.0.0/16' })]);
    expect(() => permittedRanges(['pypi.org'])).toThrow(
      "ABX_EGRESS_PERMIT takes CIDRs only; 'pypi.org' is not one",
    );
  });

  test("docs/providers.md's example is the object the provider makes", () => {
    const [example] = readmeBlocks(join(ROOT, 'docs', 'providers.md')).filter(
      (b) => b.heading === 'The internet network' && b.lang === 'yaml',
    );
    const spec = parseYaml(example?.code ?? '').spec;
    const id = spec.podSelector.matchLabels['abx.dev/sandbox-id'];
    const made = egressNetworkPolicy(
      id,
      { allowOut: ['203.0.113.7'], denyOut: ['203.0.113.0/24'] },
      { namespace: NAMESPACE, permit: [] },
    );
    expect(spec).toEqual(made.spec);
  });
});

const kube = kubeDoubles('kube-network', [{}, { crds: true }]);

function specOf(label: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  const id = `${label}-${randomBytes(4).toString('hex')}`;
  return {
    id,
    accessToken: randomBytes(24).toString('hex'),
    dir: join(kube.scratch, 'sandboxes', id),
    env: {},
    workdir: '/home/user',
    resources: {},
    network: 'internet',
    ...overrides,
  };
}

/** What of sandbox `id` is still in a double (events aside). */
const leftovers = (id: string, on = kube.double) =>
  on.objects().filter((o) => o.includes(`abx-${id}`) && !o.startsWith('events'));
const stored = (id: string, on = kube.double) =>
  on.get('networkpolicies', NAMESPACE, `abx-${id}-egress`);
/** The pod and NetworkPolicy of sandbox `id`, in the order they were deleted. */
const gone = (id: string, on = kube.double) =>
  on.deleted.filter((o) => o === `pods ${NAMESPACE}/abx-${id}` || o.endsWith(`/abx-${id}-egress`));

describe.skipIf(kube.unavailable)(
  `kubernetes provider: the internet network (API double)${kube.unavailable ? `: skipped, ${kube.unavailable}` : ''}`,
  () => {
    afterEach(() => {
      for (const double of kube.all) double.refuse = () => undefined;
    });

    test('create makes the NetworkPolicy before the pod, owned by the pod and selecting it alone; a live change replaces it; kill deletes it', async () => {
      const provider = kube.provider();
      const policy = { allowOut: ['203.0.113.7'], denyOut: ['203.0.113.0/24'] };
      const spec = specOf('net', { egress: policy });
      const other = specOf('offline', { network: 'none' });
      const before = kube.double.requests.length;
      const handle = await provider.create(spec);
      const offline = await provider.create(other);
      let live: SandboxHandle = handle;
      try {
        const made = kube.double.requests
          .slice(before)
          .filter((r) => r.method === 'POST')
          .map((r) => r.path.split('/').at(-1));
        expect(made.slice(0, 2)).toEqual(['networkpolicies', 'pods']);
        const pod = kube.double.get('pods', NAMESPACE, podName(spec.id));
        const object = stored(spec.id);
        expect(object?.metadata.ownerReferences).toEqual([
          { apiVersion: 'v1', kind: 'Pod', name: podName(spec.id), uid: pod?.metadata.uid },
        ]);
        expect(object?.spec).toEqual({
          podSelector: { matchLabels: { 'abx.dev/sandbox-id': spec.id } },
          policyTypes: ['Egress'],
          egress: [
            DNS_RULE,
            tcpTo(
              { cidr: '0.0.0.0/0', except: [...ALWAYS_V4, '203.0.113.0/24'] },
              { cidr: '203.0.113.7/32' },
              { cidr: '::/0', except: ALWAYS_V6 },
            ),
          ],
        });
        // Its selector matches its pod, and no other pod of the namespace.
        const selects = (labels: Record<string, string> = {}) =>
          Object.entries(object?.spec.podSelector.matchLabels).every(([k, v]) => labels[k] === v);
        const pods = kube.double
          .objects('pods')
          .map((o) => kube.double.get('pods', NAMESPACE, o.split('/')[1] as string));
        expect(
          pods.filter((p) => selects(p?.metadata.labels)).map((p) => p?.metadata.name),
        ).toEqual([podName(spec.id)]);
        expect(pod?.metadata.labels['abx.dev/network']).toBe('internet');
        // A sandbox of another network has no policy of its own.
        expect(stored(other.id)).toBeUndefined();
        expect(handle.pod?.egress).toEqual(policy);
        expect(provider.isolation().limits.egress).toMatchObject({ enforced: true });
        expect(provider.isolation().limits.egress?.how).toContain('NetworkPolicy per sandbox');

        // Live: the stored object is replaced (same object, new generation), its owner kept.
        const uid = object?.metadata.uid;
        live = await provider.setNetwork(handle, {
          allowOut: [],
          denyOut: ['0.0.0.0/0', '::/0', '198.51.100.0/24'],
        });
        expect(live.pod?.egress).toEqual({
          allowOut: [],
          denyOut: ['0.0.0.0/0', '::/0', '198.51.100.0/24'],
        });
        const replaced = stored(spec.id);
        expect(replaced?.metadata).toMatchObject({ uid, generation: 2 });
        expect(replaced?.metadata.ownerReferences).toEqual(object?.metadata.ownerReferences);
        expect(replaced?.spec.egress).toEqual([DNS_RULE]);
        expect(
          kube.double.requests.some(
            (r) => r.method === 'PUT' && r.path.endsWith(`/networkpolicies/abx-${spec.id}-egress`),
          ),
        ).toBe(true);
        // A domain that would matter is refused; the policy stays as it was.
        const refused = await provider
          .setNetwork(live, { allowOut: ['pypi.org'], denyOut: ['0.0.0.0/0'] })
          .catch((e: Error) => e);
        expect(refused).toBeInstanceOf(InvalidArgumentError);
        expect((refused as Error).message).toContain(
          `sandbox ${spec.id}'s egress policy was not changed: the kubernetes provider enforces egress with a NetworkPolicy, which matches addresses, never names, so it cannot enforce allowOut pypi.org`,
        );
        expect(stored(spec.id)?.spec.egress).toEqual([DNS_RULE]);
        // A domain that changes nothing (allowed where every address is) is taken; a replace
        // that loses a race with another writer (409) reads the policy again and tries again.
        let puts = 0;
        kube.double.refuse = ({ method, resource }) =>
          method === 'PUT' && resource === 'networkpolicies' && puts++ === 0
            ? {
                code: 409,
                reason: 'Conflict',
                message: 'Operation cannot be fulfilled: the object has been modified',
              }
            : undefined;
        live = await provider.setNetwork(live, { allowOut: ['pypi.org'], denyOut: [] });
        expect(puts).toBe(2);
        expect(stored(spec.id)?.spec.egress).toEqual([
          DNS_RULE,
          tcpTo({ cidr: '0.0.0.0/0', except: ALWAYS_V4 }, { cidr: '::/0', except: ALWAYS_V6 }),
        ]);
      } finally {
        await provider.kill(live);
        await provider.kill(offline);
      }
      expect(leftovers(spec.id)).toEqual([]);
      expect(leftovers(other.id)).toEqual([]);
      expect(kube.double.livePids(podName(spec.id))).toEqual([]);
      // The pod went first: a pod that no policy selects may reach everything.
      expect(gone(spec.id)).toEqual([
        `pods ${NAMESPACE}/${podName(spec.id)}`,
        `networkpolicies ${NAMESPACE}/abx-${spec.id}-egress`,
      ]);
    });

    test('a policy naming domains that matter is refused at create, naming them and what to do; nothing is made', async () => {
      const provider = kube.provider();
      const before = kube.double.requests.length;
      for (const egress of [
        { allowOut: ['pypi.org', '*.github.com'], denyOut: ['0.0.0.0/0'] },
        { allowOut: [], denyOut: ['evil.example'] },
      ]) {
        const spec = specOf('domains', { egress });
        const error = await provider.create(spec).catch((e: Error) => e);
        expect(error).toBeInstanceOf(InvalidArgumentError);
        const message = (error as Error).message;
        expect(message).toContain(`sandbox ${spec.id} did not start: the kubernetes provider`);
        expect(message).toContain(
          egress.denyOut[0] === 'evil.example'
            ? 'cannot enforce denyOut evil.example'
            : 'cannot enforce allowOut pypi.org, allowOut *.github.com',
        );
        expect(message).toContain(
          'give their addresses as CIDRs, or run the sandbox on the local or docker provider',
        );
      }
      // Refused before any call to the cluster.
      expect(kube.double.requests.slice(before)).toEqual([]);
    });

    test('an egress proxy (network.egressProxy) is refused at create by name; nothing is made', async () => {
      const provider = kube.provider();
      const before = kube.double.requests.length;
      const spec = specOf('socks', {
        egress: { allowOut: [], denyOut: [], egressProxy: { address: 'proxy.example.com:1080' } },
      });
      const error = await provider.create(spec).catch((e: Error) => e);
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect((error as Error).message).toContain(
        `sandbox ${spec.id} did not start: network.egressProxy (your SOCKS5 proxy) needs abx's egress proxy`,
      );
      expect(kube.double.requests.slice(before)).toEqual([]);
    });

    test('a NetworkPolicy the cluster refuses leaves no pod, no Secret, no policy', async () => {
      const provider = kube.provider();
      const before = kube.double.requests.length;
      // An admission webhook (say, Gatekeeper) that refuses the policy.
      kube.double.refuse = ({ method, resource }) =>
        method === 'POST' && resource === 'networkpolicies'
          ? {
              code: 400,
              reason: 'BadRequest',
              message:
                'admission webhook "validation.gatekeeper.sh" denied the request: [no-ipblock] ipBlock peers are not allowed',
            }
          : undefined;
      const spec = specOf('webhook', { egress: { allowOut: [], denyOut: [] } });
      const error = await provider.create(spec).catch((e: Error) => e);
      expect(error).toBeInstanceOf(SandboxStartError);
      expect((error as Error).message).toContain(
        `sandbox ${spec.id} did not start: creating NetworkPolicy ${NAMESPACE}/abx-${spec.id}-egress: admission webhook "validation.gatekeeper.sh" denied the request`,
      );
      expect(leftovers(spec.id)).toEqual([]);
      expect(
        kube.double.requests
          .slice(before)
          .some((r) => r.method === 'POST' && r.path.endsWith('/pods')),
      ).toBe(false);

      // An account without the permission: said as such (RBAC), nothing left either.
      kube.double.refuse = ({ method, resource }) =>
        method === 'POST' && resource === 'networkpolicies'
          ? {
              code: 403,
              reason: 'Forbidden',
              message:
                'networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:abx-system:abx-control-plane" cannot create resource "networkpolicies" in API group "networking.k8s.io" in the namespace "sandboxes"',
            }
          : undefined;
      const denied = specOf('rbac', { egress: { allowOut: [], denyOut: [] } });
      const forbidden = await provider.create(denied).catch((e: Error) => e);
      expect(forbidden).toBeInstanceOf(UnavailableError);
      expect((forbidden as Error).message).toContain('cannot create resource "networkpolicies"');
      expect((forbidden as Error).message).toContain('RBAC rules in docs/providers.md');
      expect(leftovers(denied.id)).toEqual([]);

      // The pod refused after its policy was made: the policy goes too.
      kube.double.refuse = ({ method, resource }) =>
        method === 'POST' && resource === 'pods'
          ? { code: 400, reason: 'BadRequest', message: 'admission webhook "pods" denied it' }
          : undefined;
      const late = specOf('late', { egress: { allowOut: [], denyOut: [] } });
      const failed = await provider.create(late).catch((e: Error) => e);
      expect(failed).toBeInstanceOf(SandboxStartError);
      expect(leftovers(late.id)).toEqual([]);
    });

    test('the sweep deletes NetworkPolicies whose sandbox is gone, with orphan pods; a running or young one stays', async () => {
      const provider = kube.provider();
      const sandboxesDir = join(kube.scratch, 'sandboxes');
      const running = await provider.create(
        specOf('kept', { egress: { allowOut: [], denyOut: [] } }),
      );
      const runningId = running.pod?.name.replace(/^abx-/, '') as string;
      try {
        const context = {
          namespace: NAMESPACE,
          sandboxesHash: sandboxesHash(sandboxesDir),
          permit: [],
        };
        // A policy left by a daemon killed after it made it, before its pod (made as kubectl would).
        const lone = specOf('lone');
        await kube.double.put(
          'networkpolicies',
          NAMESPACE,
          egressNetworkPolicy(lone.id, { allowOut: [], denyOut: [] }, context),
        );
        // An orphan internet pod with its policy: both go.
        const orphan = specOf('orphan');
        await kube.double.put(
          'networkpolicies',
          NAMESPACE,
          egressNetworkPolicy(orphan.id, { allowOut: [], denyOut: [] }, context),
        );
        kube.double.fate = () => ({ kind: 'unschedulable' });
        await kube.double.put(
          'pods',
          NAMESPACE,
          sandboxPod(orphan, {
            namespace: NAMESPACE,
            runtimeImage: RUNTIME_IMAGE,
            baseImage: 'debian:bookworm-slim',
            sandboxesDir,
          }),
        );
        kube.double.fate = () => ({ kind: 'run' });
        // Made since `startedBefore`: maybe another replica's create under way, left alone.
        expect(
          await provider.sweepOrphans(sandboxesDir, new Set([runningId]), Date.now() - 60_000),
        ).toEqual([]);
        expect(stored(lone.id)).toBeDefined();
        const swept = await provider.sweepOrphans(sandboxesDir, new Set([runningId]));
        expect(swept.sort()).toEqual([lone.id, orphan.id].sort());
        expect(leftovers(lone.id)).toEqual([]);
        expect(leftovers(orphan.id)).toEqual([]);
        expect(stored(runningId)).toBeDefined();
      } finally {
        await provider.kill(running);
      }
      expect(leftovers(runningId)).toEqual([]);
    });

    test('claims mode refuses the internet network by name, and its isolation report says so', async () => {
      const provider = kube.provider({ agentSandbox: 'claims' }, kube.all[1] as KubeApiDouble);
      const spec = specOf('claimed', { egress: { allowOut: [], denyOut: [] } });
      const error = await provider.create(spec).catch((e: Error) => e);
      expect(error).toBeInstanceOf(SandboxStartError);
      expect((error as Error).message).toContain(
        `sandbox ${spec.id} did not start: the internet network is not given in claims mode`,
      );
      expect(kube.all[1]?.objects().filter((o) => !o.startsWith('events'))).toEqual([]);
      expect(provider.isolation().limits.egress).toMatchObject({ enforced: false });
    });

    test('with agent-sandbox, the Sandbox and its pod own the policy: the cluster ending the Sandbox at its shutdownTime takes it after the pod, with no kill', async () => {
      const provider = kube.provider({}, kube.all[1] as KubeApiDouble);
      const cluster = kube.all[1] as KubeApiDouble;
      const spec = specOf('crd', { timeoutMs: 15_000, egress: { allowOut: [], denyOut: [] } });
      const handle = await provider.create(spec);
      try {
        const sandbox = cluster.get('sandboxes', NAMESPACE, podName(spec.id));
        const pod = cluster.get('pods', NAMESPACE, podName(spec.id));
        // Both: the controller may make the pod again (the Sandbox keeps the policy for it), and
        // the collector deletes the policy only once both are gone (the pod last).
        expect(stored(spec.id, cluster)?.metadata.ownerReferences).toEqual([
          {
            apiVersion: 'agents.x-k8s.io/v1beta1',
            kind: 'Sandbox',
            name: podName(spec.id),
            uid: sandbox?.metadata.uid,
          },
          { apiVersion: 'v1', kind: 'Pod', name: podName(spec.id), uid: pod?.metadata.uid },
        ]);
        for (const deadline = Date.now() + 30_000; Date.now() < deadline; ) {
          if (leftovers(spec.id, cluster).length === 0) break;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        expect(leftovers(spec.id, cluster)).toEqual([]);
        expect(gone(spec.id, cluster)).toEqual([
          `pods ${NAMESPACE}/${podName(spec.id)}`,
          `networkpolicies ${NAMESPACE}/abx-${spec.id}-egress`,
        ]);
      } finally {
        await provider.kill(handle);
      }
    }, 60_000);
  },
);

describe.skipIf(kube.unavailable)(
  `the daemon on kubernetes: the internet network (API double)${kube.unavailable ? `: skipped, ${kube.unavailable}` : ''}`,
  () => {
    let daemon: Daemon | undefined;
    afterAll(async () => {
      await daemon?.stop().catch(() => undefined);
    });

    test('a policy at create, shown, changed live and after a restart (adoption), refused with domains; DELETE removes the policy', async () => {
      const home = join(kube.scratch, 'daemon-home');
      daemon = new Daemon({
        home,
        provider: kube.provider(),
        apiPort: 0,
        gatewayPort: 0,
        warmPool: 0,
      });
      let info = await daemon.start();
      const auth = {
        authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
      };
      const api = (path: string, method = 'GET', body?: unknown) =>
        call(`${info.apiUrl}${path}`, { method, headers: auth, ...(body ? { body } : {}) });

      const created = await api('/v1/sandboxes', 'POST', {
        network: { allowOut: ['198.51.100.0/24'] },
        allowInternetAccess: false,
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const id = created.body.sandboxId as string;
      expect(created.body.network).toEqual({
        allowOut: ['198.51.100.0/24'],
        denyOut: ['0.0.0.0/0', '::/0'],
      });
      expect(stored(id)?.spec.egress).toEqual([DNS_RULE, tcpTo({ cidr: '198.51.100.0/24' })]);

      const changed = await api(`/v1/sandboxes/${id}/network`, 'PUT', {
        allowOut: [],
        denyOut: ['203.0.113.0/24'],
      });
      expect(changed.status, JSON.stringify(changed.body)).toBe(200);
      expect(changed.body.network).toEqual({ allowOut: [], denyOut: ['203.0.113.0/24'] });
      expect(stored(id)?.spec.egress[1].to[0].ipBlock.except).toContain('203.0.113.0/24');
      const domains = await api(`/v1/sandboxes/${id}/network`, 'PUT', {
        allowOut: ['pypi.org'],
        denyOut: ['0.0.0.0/0'],
      });
      expect(domains.status).toBe(400);
      expect(domains.body.error).toContain('cannot enforce allowOut pypi.org');
      // No counters on Kubernetes: said, with where the policy is.
      const counters = await api(`/v1/sandboxes/${id}/network`);
      expect(counters.status).toBe(400);
      expect(counters.body.error).toContain('a Kubernetes NetworkPolicy has no counters');
      const refused = await api('/v1/sandboxes', 'POST', {
        network: { allowOut: ['pypi.org'], denyOut: ['0.0.0.0/0'] },
      });
      expect(refused.status).toBe(400);
      expect(refused.body.error).toContain('cannot enforce allowOut pypi.org');
      expect(kube.double.objects('pods')).toEqual([`pods ${NAMESPACE}/abx-${id}`]);

      // A restart: the new daemon adopts the sandbox and makes its policy what the registry
      // says again (a cluster admin deleted it meanwhile).
      await daemon.stop();
      await fetch(
        `${kube.double.kubeConfig().getCurrentCluster()?.server}/apis/networking.k8s.io/v1/namespaces/${NAMESPACE}/networkpolicies/abx-${id}-egress`,
        { method: 'DELETE', headers: { authorization: 'Bearer double-token' } },
      );
      expect(stored(id)).toBeUndefined();
      daemon = new Daemon({
        home,
        provider: kube.provider(),
        apiPort: 0,
        gatewayPort: 0,
        warmPool: 0,
      });
      info = await daemon.start();
      expect((await api(`/v1/sandboxes/${id}`)).body.network).toEqual({
        allowOut: [],
        denyOut: ['203.0.113.0/24'],
      });
      expect(stored(id)?.spec.egress[1].to[0].ipBlock.except).toContain('203.0.113.0/24');
      expect(stored(id)?.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'Pod' });

      const removed = await api(`/v1/sandboxes/${id}`, 'DELETE');
      expect(removed.status).toBeLessThan(300);
      expect(leftovers(id)).toEqual([]);
    }, 90_000);
  },
);
