import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { Pod } from 'kubernetes-models/v1/Pod';
import { afterEach, describe, expect, test } from 'vitest';
import { parseTemplate } from '../../src/commands/template.js';
import { envdRequest } from '../../src/control/envd-request.js';
import { SandboxStartError, TemplateError, UnavailableError } from '../../src/errors.js';
import { checkCluster } from '../../src/providers/kubernetes/cluster-check.js';
import { KubernetesProvider } from '../../src/providers/kubernetes/kubernetes-provider.js';
import {
  MANAGED_BY,
  MANAGED_BY_LABEL,
  NETWORK_LABEL,
  podName,
  SANDBOX_ID_LABEL,
  SANDBOXES_LABEL,
  sandboxesHash,
  sandboxPod,
} from '../../src/providers/kubernetes/pod-spec.js';
import { type SandboxSpec, workspaceUnavailableOn } from '../../src/providers/provider.js';
import { ROOT } from '../helpers/build.js';
import { closedPort, kubeletUnavailable } from '../helpers/kube-api-double.js';
import { kubeDoubles, NAMESPACE } from '../helpers/kube-fixture.js';

/** Why the double's kubelet cannot run pods here (the tests that need it skip), if it cannot. */
const unavailable = kubeletUnavailable();
const MiB = 1024 * 1024;

function specOf(label: string, dir: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  const id = `${label}-${randomBytes(4).toString('hex')}`;
  return {
    id,
    accessToken: randomBytes(24).toString('hex'),
    dir: join(dir, id),
    env: {},
    workdir: '/home/user',
    resources: {},
    network: 'none',
    ...overrides,
  };
}

test('the kubernetes provider has no workspaces, and says why', () => {
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromOptions({
    clusters: [{ name: 'c', server: 'https://127.0.0.1:1' }],
    users: [{ name: 'u' }],
    contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
    currentContext: 'x',
  });
  const provider = new KubernetesProvider({ kubeConfig });
  expect(workspaceUnavailableOn(provider)).toMatch(
    /^the kubernetes provider has no workspaces: .*pod on a node of the cluster.*--provider local/,
  );
});

describe('a template becomes a pod', () => {
  const context = {
    namespace: NAMESPACE,
    runtimeImage: 'registry.example/abx-runtime:1',
    baseImage: 'debian:bookworm-slim',
    sandboxesDir: '/var/lib/abx/sandboxes',
  };

  test("the template's kubernetes: section, resources and user shape a pod that Kubernetes' schema accepts", () => {
    const template = parseTemplate(
      [
        'name: gpu-tools',
        'image: python:3.12-slim',
        'resources: { cpu: 1.5, memory: 512m, disk: 1g }',
        'kubernetes:',
        '  runtime_class: gvisor',
        '  node_selector: { kubernetes.io/arch: amd64, pool: sandboxes }',
        '  tolerations:',
        '    - { key: sandbox, operator: Exists, effect: NoSchedule }',
        '    - { key: dedicated, value: agents, effect: NoExecute, toleration_seconds: 60 }',
      ].join('\n'),
    );
    const spec = specOf('shape', '/var/lib/abx/sandboxes', {
      image: 'python:3.12-slim',
      resources: template.resources,
      ...(template.kubernetes ? { kubernetes: template.kubernetes } : {}),
      capabilities: ['shell', 'files'],
      template: 'gpu-tools',
    });
    const pod = sandboxPod(spec, context);
    expect(() => new Pod(pod as ConstructorParameters<typeof Pod>[0]).validate()).not.toThrow();
    expect(pod.metadata?.labels).toEqual({
      [MANAGED_BY_LABEL]: MANAGED_BY,
      [SANDBOX_ID_LABEL]: spec.id,
      [SANDBOXES_LABEL]: sandboxesHash('/var/lib/abx/sandboxes'),
      // deploy/kubernetes' NetworkPolicy denies egress to pods of `network: none` by this label.
      [NETWORK_LABEL]: spec.network,
    });
    expect(pod.spec?.runtimeClassName).toBe('gvisor');
    expect(pod.spec?.nodeSelector).toEqual({ 'kubernetes.io/arch': 'amd64', pool: 'sandboxes' });
    expect(pod.spec?.tolerations).toEqual([
      { key: 'sandbox', operator: 'Exists', effect: 'NoSchedule' },
      {
        key: 'dedicated',
        operator: 'Equal',
        value: 'agents',
        effect: 'NoExecute',
        tolerationSeconds: 60,
      },
    ]);
    const main = pod.spec?.containers[0];
    expect(main?.image).toBe('python:3.12-slim');
    expect(main?.resources).toEqual({
      requests: {
        cpu: '1500m',
        memory: String(512 * MiB),
        'ephemeral-storage': String(1024 * MiB),
      },
      limits: { cpu: '1500m', memory: String(512 * MiB), 'ephemeral-storage': String(1024 * MiB) },
    });
    for (const container of [main, pod.spec?.initContainers?.[0]]) {
      expect(container?.securityContext).toMatchObject({
        runAsUser: 1000,
        runAsGroup: 1000,
        runAsNonRoot: true,
        allowPrivilegeEscalation: false,
        capabilities: { drop: ['ALL'] },
        seccompProfile: { type: 'RuntimeDefault' },
      });
    }
    expect(pod.spec?.initContainers?.[0]?.image).toBe(context.runtimeImage);
    expect(pod.spec?.automountServiceAccountToken).toBe(false);
    // The token is in no field of the pod: only in its Secret, mounted in the init container.
    expect(JSON.stringify(pod)).not.toContain(spec.accessToken);
    expect(main?.volumeMounts?.map((m) => m.name)).not.toContain('abx-token');
  });

  test('bad kubernetes: values are refused with what Kubernetes accepts, each at its place', () => {
    let error: unknown;
    try {
      parseTemplate(
        [
          'name: bad',
          'kubernetes:',
          '  runtime_class: gVisor!',
          '  node_selector: { "bad key!": x, zone: "-no-" }',
          '  tolerations:',
          '    - { operator: Maybe }',
          '    - { key: a, operator: Exists, value: b }',
          '    - { key: a, effect: NoSchedule, toleration_seconds: 5 }',
          '  service_account: x',
        ].join('\n'),
        'template.yaml',
      );
    } catch (thrown) {
      error = thrown;
    }
    expect(error).toBeInstanceOf(TemplateError);
    const message = (error as Error).message;
    expect(message).toContain('kubernetes.runtime_class: must name a RuntimeClass');
    expect(message).toContain('kubernetes.node_selector.bad key!: is not a label key');
    expect(message).toContain('kubernetes.node_selector.zone: is not a label value');
    expect(message).toContain(
      'kubernetes.tolerations[0].operator: must be Equal (the default) or Exists',
    );
    expect(message).toContain(
      'kubernetes.tolerations[1].value: must be left out with operator Exists',
    );
    expect(message).toContain(
      'kubernetes.tolerations[2].toleration_seconds: applies only with effect NoExecute',
    );
    expect(message).toContain('kubernetes.service_account: unknown key');
  });
});

describe.skipIf(unavailable)(
  `kubernetes provider: faults (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    const kube = kubeDoubles('kube-faults');
    const make = (options: { startTimeoutMs?: number } = {}) => kube.provider(options);

    afterEach(() => {
      kube.double.fate = () => ({ kind: 'run' });
    });

    test('checkCluster (abx doctor): the server answers, the namespace, each permission, no agent-sandbox; a denied one is a problem', async () => {
      const provider = kube.provider({ watch: false });
      const ok = await checkCluster(provider);
      expect(ok).toMatchObject({
        reachable: true,
        version: 'v1.31.0-double',
        namespace: NAMESPACE,
        agentSandbox: [],
        problems: [],
      });
      expect(ok.permissions.map((p) => `${p.verb} ${p.resource} ${p.allowed}`)).toContain(
        'watch pods true',
      );
      kube.double.denied.add('create secrets');
      try {
        const denied = await checkCluster(provider);
        expect(denied.problems).toEqual([
          `this account may not create secrets in namespace ${NAMESPACE}: add it to the daemon's Role (docs/providers.md, "RBAC")`,
        ]);
      } finally {
        kube.double.denied.clear();
      }
    });

    test('abx doctor --provider kubernetes reads a kubeconfig file and reports the cluster; exit 1 with a problem', async () => {
      const kubeconfig = join(kube.scratch, 'kubeconfig');
      writeFileSync(
        kubeconfig,
        [
          'apiVersion: v1',
          'kind: Config',
          'clusters:',
          `- name: double\n  cluster:\n    server: ${kube.double.kubeConfig().getCurrentCluster()?.server}\n    insecure-skip-tls-verify: true`,
          'users:',
          '- name: tester\n  user:\n    token: double-token',
          'contexts:',
          `- name: double\n  context:\n    cluster: double\n    user: tester\n    namespace: ${NAMESPACE}`,
          'current-context: double',
        ].join('\n'),
      );
      const doctor = () =>
        new Promise<{ code: number; stdout: string }>((resolve) => {
          execFile(
            process.execPath,
            [
              join(ROOT, 'dist', 'cli.js'),
              'doctor',
              '--provider',
              'kubernetes',
              '--kubeconfig',
              kubeconfig,
            ],
            { timeout: 60_000 },
            (error, stdout) => resolve({ code: error ? Number(error.code) : 0, stdout }),
          );
        });
      const ok = await doctor();
      expect(ok.stdout).toContain('answers (v1.31.0-double)');
      expect(ok.stdout).toContain(`namespace   ${NAMESPACE}`);
      expect(ok.stdout).toContain('ok          watch pods');
      expect(ok.stdout).toContain('agent-sandbox  not installed');
      expect(ok.code).toBe(0);
      kube.double.denied.add('delete pods');
      try {
        const denied = await doctor();
        expect(denied.code).toBe(1);
        expect(denied.stdout).toContain('NO          delete pods');
        expect(denied.stdout).toContain(
          `problem: this account may not delete pods in namespace ${NAMESPACE}`,
        );
      } finally {
        kube.double.denied.clear();
      }
    });

    test('an API server that does not answer: UnavailableError naming it, from create and sweep', async () => {
      const port = await closedPort();
      const config = new KubeConfig();
      config.loadFromOptions({
        clusters: [{ name: 'gone', server: `http://127.0.0.1:${port}`, skipTLSVerify: true }],
        users: [{ name: 'u', token: 't' }],
        contexts: [{ name: 'gone', cluster: 'gone', user: 'u', namespace: NAMESPACE }],
        currentContext: 'gone',
      });
      const provider = kube.provider({ kubeConfig: config });
      const spec = specOf('unreachable', kube.scratch);
      const error = await provider.create(spec).catch((thrown: unknown) => thrown);
      expect(error).toBeInstanceOf(UnavailableError);
      expect((error as Error).message).toContain(`http://127.0.0.1:${port}`);
      expect((error as Error).message).toMatch(/does not answer \(ECONNREFUSED\)/);
      await expect(provider.sweepOrphans(kube.scratch, new Set())).rejects.toThrow(
        UnavailableError,
      );
      const report = await checkCluster(provider);
      expect(report.reachable).toBe(false);
      expect(report.problems.join('\n')).toContain(`http://127.0.0.1:${port} does not answer`);
    });

    test('a pod that cannot be scheduled: SandboxStartError with the scheduler’s reason within the timeout, and no pod or secret left', async () => {
      kube.double.fate = () => ({
        kind: 'unschedulable',
        message: '0/3 nodes are available: 3 Insufficient memory.',
      });
      const spec = specOf('pending', kube.scratch, { resources: { memory: 64 * 1024 * MiB } });
      const error = await make({ startTimeoutMs: 1500 })
        .create(spec)
        .catch((thrown: unknown) => thrown);
      expect(error).toBeInstanceOf(SandboxStartError);
      const message = (error as Error).message;
      expect(message).toContain(spec.id);
      expect(message).toContain('not ready within 1500 ms');
      expect(message).toContain('Unschedulable: 0/3 nodes are available: 3 Insufficient memory.');
      expect(
        kube.double.objects().filter((o) => o.includes(spec.id) && !o.startsWith('events')),
      ).toEqual([]);
    });

    test('an image that cannot be pulled: SandboxStartError naming ErrImagePull and the image, at once, nothing left', async () => {
      kube.double.fate = () => ({ kind: 'image-pull-error' });
      const spec = specOf('pull', kube.scratch, { image: 'registry.example/no-such-image:1' });
      const error = await make({ startTimeoutMs: 60_000 })
        .create(spec)
        .catch((thrown: unknown) => thrown);
      expect(error).toBeInstanceOf(SandboxStartError);
      const message = (error as Error).message;
      expect(message).toContain('ErrImagePull');
      expect(message).toContain('registry.example/no-such-image:1');
      expect(message).not.toContain('within 60000 ms');
      expect(
        kube.double.objects().filter((o) => o.includes(spec.id) && !o.startsWith('events')),
      ).toEqual([]);
      expect(kube.double.livePids(podName(spec.id))).toEqual([]);
    });

    test('envd answers over TCP at the pod’s address only with the token; kill of a pod already gone is fine', async () => {
      const provider = make();
      const spec = specOf('tcp', kube.scratch);
      const handle = await provider.create(spec);
      try {
        expect(handle.envdSocket).toMatch(/^tcp:\/\/127\.\d+\.\d+\.\d+:49983$/);
        const refused = await envdRequest<{ type?: string }>(
          handle.envdSocket,
          'not-the-token',
          'POST',
          '/process/exec',
          { cmd: 'id -u' },
        );
        expect(refused.status).toBe(401);
        const ran = await envdRequest<{ stdout: string }>(
          handle.envdSocket,
          spec.accessToken,
          'POST',
          '/process/exec',
          { cmd: 'id -u' },
        );
        expect(ran).toMatchObject({ status: 200, body: { stdout: '1000\n' } });
      } finally {
        await provider.kill(handle);
      }
      expect(provider.isAlive(handle)).toBe(false);
      await expect(provider.kill(handle)).resolves.toBeUndefined();
      await expect(make().kill(handle)).resolves.toBeUndefined();
    });

    test('sweepOrphans removes labelled pods of its folder that the registry does not know, made by anyone (before startedBefore when given)', async () => {
      const provider = make();
      const sandboxes = join(kube.scratch, 'sweep');
      const known = specOf('known', sandboxes);
      const handle = await provider.create(known);
      try {
        // A pod left by a daemon that crashed before writing its row (made here as kubectl would).
        const orphan = sandboxPod(specOf('orphan', sandboxes), {
          namespace: NAMESPACE,
          runtimeImage: 'abx-runtime:test',
          baseImage: 'debian:bookworm-slim',
          sandboxesDir: sandboxes,
        });
        kube.double.fate = () => ({ kind: 'unschedulable' });
        await kube.double.put('pods', NAMESPACE, orphan);
        // Another daemon's pod (another folder): not this daemon's to remove.
        const other = sandboxPod(specOf('other', join(kube.scratch, 'elsewhere')), {
          namespace: NAMESPACE,
          runtimeImage: 'abx-runtime:test',
          baseImage: 'debian:bookworm-slim',
          sandboxesDir: join(kube.scratch, 'elsewhere'),
        });
        await kube.double.put('pods', NAMESPACE, other);
        const orphanId = orphan.metadata?.labels?.[SANDBOX_ID_LABEL] as string;
        // With replicas on the registry, a pod made since `startedBefore` may be a create under way.
        expect(
          await provider.sweepOrphans(sandboxes, new Set([known.id]), Date.now() - 60_000),
        ).toEqual([]);
        expect(kube.double.objects('pods')).toContain(`pods ${NAMESPACE}/${orphan.metadata?.name}`);
        expect(
          await provider.sweepOrphans(sandboxes, new Set([known.id]), Date.now() + 1000),
        ).toEqual([orphanId]);
        expect(kube.double.objects('pods')).not.toContain(
          `pods ${NAMESPACE}/${orphan.metadata?.name}`,
        );
        expect(kube.double.objects('pods')).toContain(`pods ${NAMESPACE}/${other.metadata?.name}`);
        expect(provider.isAlive(handle)).toBe(true);
        await make().sweepOrphans(join(kube.scratch, 'elsewhere'), new Set());
        expect(kube.double.objects('pods')).not.toContain(
          `pods ${NAMESPACE}/${other.metadata?.name}`,
        );
      } finally {
        await provider.kill(handle);
      }
    });
  },
);

describe.skipIf(unavailable)(
  `kubernetes provider with agent-sandbox installed (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    const kube = kubeDoubles('kube-crd', [{ crds: true }]);

    test('found by discovery: a Sandbox per create, its pod made by the controller, shutdownTime from the timeout ends it', async () => {
      const provider = kube.provider();
      expect(await provider.usesAgentSandbox()).toBe(true);
      expect((await checkCluster(provider)).agentSandbox).toEqual([
        'agents.x-k8s.io',
        'extensions.agents.x-k8s.io',
      ]);
      // Long enough for a create on a loaded machine to finish before the shutdownTime.
      const spec = specOf('crd', kube.scratch, { timeoutMs: 15_000 });
      const before = Date.now();
      const handle = await provider.create(spec);
      try {
        expect(handle.pod).toEqual({ namespace: NAMESPACE, name: podName(spec.id), sandbox: true });
        const sandbox = kube.double.get('sandboxes', NAMESPACE, podName(spec.id));
        expect(sandbox?.spec.shutdownPolicy).toBe('Delete');
        const shutdown = Date.parse(sandbox?.spec.shutdownTime);
        expect(shutdown).toBeGreaterThanOrEqual(Math.floor(before / 1000) * 1000 + 15_000);
        // Whole seconds, rounded up.
        expect(shutdown).toBeLessThanOrEqual(Date.now() + 16_000);
        const pod = kube.double.get('pods', NAMESPACE, podName(spec.id));
        expect(pod?.metadata.ownerReferences).toMatchObject([
          { kind: 'Sandbox', name: podName(spec.id), uid: sandbox?.metadata.uid },
        ]);
        expect(
          kube.double.get('secrets', NAMESPACE, `abx-${spec.id}-token`)?.metadata.ownerReferences,
        ).toMatchObject([{ kind: 'Sandbox', uid: sandbox?.metadata.uid }]);
        // The cluster ends it at its shutdownTime, with no control plane involved.
        let alive = true;
        for (const deadline = shutdown + 10_000; alive && Date.now() < deadline; ) {
          alive = provider.isAlive(handle);
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        expect(alive).toBe(false);
        expect(
          kube.double.objects().filter((o) => o.includes(spec.id) && !o.startsWith('events')),
        ).toEqual([]);
      } finally {
        await provider.kill(handle);
      }
    }, 60_000);

    test('setExpiry moves the Sandbox’s shutdownTime: a sandbox given more time is not ended at the old one', async () => {
      const provider = kube.provider();
      // Long enough for a create on a loaded machine to finish before the first shutdownTime.
      const spec = specOf('extend', kube.scratch, { timeoutMs: 15_000 });
      const handle = await provider.create(spec);
      try {
        const first = Date.parse(
          kube.double.get('sandboxes', NAMESPACE, podName(spec.id))?.spec.shutdownTime,
        );
        const later = Date.now() + 60_000;
        await provider.setExpiry(handle, later);
        const sandbox = kube.double.get('sandboxes', NAMESPACE, podName(spec.id));
        expect(Date.parse(sandbox?.spec.shutdownTime)).toBeGreaterThanOrEqual(later - 1000);
        // Past the first shutdownTime it still runs and answers.
        await new Promise((resolve) => setTimeout(resolve, Math.max(0, first - Date.now()) + 1000));
        expect(provider.isAlive(handle)).toBe(true);
        const health = await envdRequest(handle.envdSocket, spec.accessToken, 'GET', '/health');
        expect(health.status).toBe(200);
      } finally {
        await provider.kill(handle);
      }
      // A sandbox already gone: nothing to move, no error.
      await expect(provider.setExpiry(handle, Date.now() + 1000)).resolves.toBeUndefined();
    }, 60_000);

    test('agentSandbox: false makes plain pods even where the CRDs are installed', async () => {
      const provider = kube.provider({ agentSandbox: false });
      const spec = specOf('plain', kube.scratch);
      const handle = await provider.create(spec);
      try {
        expect(handle.pod?.sandbox).toBeUndefined();
        expect(kube.double.objects('sandboxes')).toEqual([]);
        expect(kube.double.objects('pods')).toEqual([`pods ${NAMESPACE}/${podName(spec.id)}`]);
      } finally {
        await provider.kill(handle);
      }
      expect(kube.double.objects('pods')).toEqual([]);
    });
  },
);

describe.skipIf(unavailable)(
  `kubernetes provider with agent-sandbox claims (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    const kube = kubeDoubles('kube-claims', [{ crds: true }]);

    /** The pool's Sandboxes (not claimed yet) whose pods are ready, by name. */
    const readyPooled = () =>
      kube.double
        .objects('sandboxes')
        .map((o) => kube.double.get('sandboxes', NAMESPACE, o.split('/')[1] as string))
        .filter((s) => s?.metadata.ownerReferences?.[0]?.kind === 'SandboxWarmPool')
        .map((s) => s?.metadata.name as string)
        .filter((name) =>
          kube.double
            .get('pods', NAMESPACE, name)
            ?.status?.conditions?.some(
              (c: { type: string; status: string }) => c.type === 'Ready' && c.status === 'True',
            ),
        );
    /** The bootstrap tokens of the only template made. */
    const bootstrap = () => {
      const [secret] = kube.double.objects('secrets').filter((o) => o.endsWith('-bootstrap'));
      const data = kube.double.get('secrets', NAMESPACE, secret?.split('/')[1] as string)?.data
        .token as string;
      const [client, control] = Buffer.from(data, 'base64').toString('utf8').split('\n');
      return { client: client as string, control: control as string };
    };

    test('a create served by a pod the warm pool started takes only its own tokens (the bootstrap ones refused), two sandboxes have different ones, and kill removes the claim and its pod', async () => {
      const provider = kube.provider({ agentSandbox: 'claims' });
      expect(provider.poolsItself).toBe(true);
      const first = specOf('claim', kube.scratch, {
        controlToken: randomBytes(24).toString('hex'),
      });
      const a = await provider.create(first);
      const second = specOf('claim', kube.scratch, {
        controlToken: randomBytes(24).toString('hex'),
      });
      let b: Awaited<ReturnType<typeof provider.create>> | undefined;
      try {
        // One SandboxTemplate, one bootstrap Secret, one SandboxWarmPool for both: one template.
        expect(kube.double.objects('sandboxtemplates')).toHaveLength(1);
        expect(kube.double.objects('sandboxwarmpools')).toHaveLength(1);
        const claim = kube.double.get('sandboxclaims', NAMESPACE, podName(first.id));
        expect(claim?.status.sandbox.name).toBe(a.pod?.name);
        expect(
          kube.double.get('sandboxes', NAMESPACE, a.pod?.name as string)?.metadata,
        ).toMatchObject({ ownerReferences: [{ kind: 'SandboxClaim', uid: claim?.metadata.uid }] });
        // The pool replenished: wait for its new pod to be ready, and create from it.
        let pooled: string[] = [];
        for (const deadline = Date.now() + 30_000; pooled.length === 0 && Date.now() < deadline; ) {
          pooled = readyPooled();
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        expect(pooled).toHaveLength(1);
        b = await provider.create(second);
        expect(b.pod).toEqual({
          namespace: NAMESPACE,
          name: pooled[0],
          claim: podName(second.id),
        });
        const boot = bootstrap();
        for (const [handle, spec, other] of [
          [a, first, second],
          [b, second, first],
        ] as const) {
          const info = (token: string) => envdRequest(handle.envdSocket, token, 'GET', '/info');
          // The bootstrap tokens: refused once the sandbox had its own.
          expect((await info(boot.client)).status).toBe(401);
          expect((await info(boot.control)).status).toBe(401);
          expect((await info(other.accessToken)).status).toBe(401);
          expect((await info(other.controlToken as string)).status).toBe(401);
          expect((await info(spec.accessToken)).status).toBe(200);
          expect((await info(spec.controlToken as string)).status).toBe(200);
          // Its id came with the claim: the pod was started before the sandbox existed.
          const run = await envdRequest<{ stdout: string }>(
            handle.envdSocket,
            spec.accessToken,
            'POST',
            '/process/exec',
            { cmd: 'printf %s "$ABX_SANDBOX_ID"' },
          );
          expect(run.body.stdout).toBe(spec.id);
        }
      } finally {
        await provider.kill(a);
        if (b) await provider.kill(b);
      }
      for (const handle of [a, b]) {
        const name = handle?.pod?.name as string;
        expect(kube.double.objects().filter((o) => o.endsWith(`/${name}`))).toEqual([]);
        expect(kube.double.livePids(name)).toEqual([]);
      }
      expect(kube.double.objects('sandboxclaims')).toEqual([]);
    }, 90_000);

    test('a claim that never binds fails within the create timeout with a clear error and leaves nothing of the sandbox', async () => {
      const provider = kube.provider({ agentSandbox: 'claims', startTimeoutMs: 3000 });
      kube.double.bindClaims = false;
      try {
        const spec = specOf('unbound', kube.scratch);
        const started = Date.now();
        const error = await provider.create(spec).catch((e: Error) => e);
        expect(error).toBeInstanceOf(SandboxStartError);
        expect((error as Error).message).toMatch(
          new RegExp(
            `sandbox ${spec.id} did not start: its SandboxClaim ${NAMESPACE}/${podName(spec.id)} was not bound to a ready pod within 3000 ms \\(the claim is not bound to a Sandbox yet\\)`,
          ),
        );
        expect(Date.now() - started).toBeLessThan(30_000);
        expect(kube.double.objects('sandboxclaims')).toEqual([]);
        expect(kube.double.objects().filter((o) => o.includes(spec.id))).toEqual([]);
      } finally {
        kube.double.bindClaims = true;
      }
    }, 60_000);

    test('a second provider uses the template’s objects; setExpiry moves the claim’s lifecycle shutdownTime; abx doctor in claims mode checks the extensions’ permissions', async () => {
      const provider = kube.provider({ agentSandbox: 'claims' });
      const spec = specOf('expiry', kube.scratch, { timeoutMs: 60_000 });
      const handle = await provider.create(spec);
      try {
        // A new provider (another daemon) found the template's objects and read its Secret back.
        expect(kube.double.objects('sandboxtemplates')).toHaveLength(1);
        expect(kube.double.objects('secrets').filter((o) => o.endsWith('-bootstrap'))).toHaveLength(
          1,
        );
        const later = Date.now() + 600_000;
        await provider.setExpiry(handle, later);
        const claim = kube.double.get('sandboxclaims', NAMESPACE, podName(spec.id));
        expect(claim?.spec.lifecycle.shutdownPolicy).toBe('Delete');
        expect(Date.parse(claim?.spec.lifecycle.shutdownTime)).toBeGreaterThanOrEqual(later - 1000);
      } finally {
        await provider.kill(handle);
      }
      await expect(provider.setExpiry(handle, Date.now() + 1000)).resolves.toBeUndefined();
      const report = await checkCluster(provider, 'claims');
      expect(report.problems).toEqual([]);
      expect(report.permissions.map((p) => `${p.verb} ${p.resource}`)).toEqual(
        expect.arrayContaining(['get secrets', 'create sandboxclaims', 'create sandboxwarmpools']),
      );
    }, 60_000);
  },
);
