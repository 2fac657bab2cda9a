import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { Sandbox } from '../../src/index.js';
import { isProcessAlive, startDaemon } from '../../src/installation/daemon-connection.js';
import {
  homeClaimName,
  podName,
  volumeClaimName,
} from '../../src/providers/kubernetes/pod-spec.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { call, type Json } from '../helpers/api-call.js';
import { kubeDoubles, NAMESPACE, RUNTIME_IMAGE } from '../helpers/kube-fixture.js';
import { hibernateKeepsFiles } from './pause-scenarios.js';

// Hibernate and volumes on Kubernetes, as a user of the daemon sees them: a daemon of its own
// (`node dist/daemon.js`, --kube-home pvc) on the API double (no cluster runs here; its kubelet
// runs the pods on this host, its provisioner gives claims storage). Kubernetes cannot freeze:
// a pause with memory is refused, clearly; a hibernate deletes the pod and keeps its home claim.

const kube = kubeDoubles('pause-kube');
const ENV = {
  ABX_PROVIDER: 'kubernetes',
  ABX_KUBE_NAMESPACE: NAMESPACE,
  ABX_KUBE_RUNTIME_IMAGE: RUNTIME_IMAGE,
  ABX_KUBE_AGENT_SANDBOX: 'false',
  ABX_KUBE_HOME: 'pvc',
  ABX_WARM_POOL: '0',
};
let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let auth: Record<string, string> = {};
/** The daemon's API now (another daemon, on another port, after a SIGKILL). */
const api = () =>
  (JSON.parse(readFileSync(join(abx?.home as string, 'daemon.json'), 'utf8')) as { apiUrl: string })
    .apiUrl;

describe.skipIf(kube.unavailable)(
  `pause on Kubernetes (API double)${kube.unavailable ? `: skipped, ${kube.unavailable}` : ''}`,
  () => {
    beforeAll(async () => {
      const kubeconfig = join(kube.scratch, 'kubeconfig');
      writeFileSync(kubeconfig, kube.double.kubeConfig(NAMESPACE).exportConfig());
      // The daemon the SDK starts (again, after a SIGKILL) inherits these.
      Object.assign(process.env, ENV, { KUBECONFIG: kubeconfig });
      abx = await createAbxHome();
      await startDaemon(abx.home);
      auth = {
        authorization: `Bearer ${readFileSync(join(abx.home, 'api-key'), 'utf8').trim()}`,
      };
    }, 120_000);

    afterAll(async () => {
      try {
        await abx?.close();
      } finally {
        for (const name of [...Object.keys(ENV), 'KUBECONFIG']) delete process.env[name];
      }
    }, 120_000);

    /** SIGKILLs the daemon; the next SDK call starts another (the environment is still set). */
    async function killDaemon(): Promise<void> {
      const home = abx?.home as string;
      const pid = (JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as { pid: number })
        .pid;
      process.kill(pid, 'SIGKILL');
      for (let i = 0; i < 500 && isProcessAlive(pid); i++) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    }

    test('a hibernated sandbox keeps its files and environment across a daemon SIGKILL: no pod meanwhile, its home claim kept', async () => {
      const home = abx?.home as string;
      await hibernateKeepsFiles({ home }, async () => {
        // While hibernated: its home claim and nothing else of it in the cluster, before the
        // daemon's SIGKILL and after.
        const [box] = await Sandbox.list({ home, state: ['paused'] });
        const id = box?.sandboxId as string;
        const left = () =>
          kube.double.objects().filter((o) => o.includes(id) && !o.startsWith('events'));
        expect(left()).toEqual([`persistentvolumeclaims ${NAMESPACE}/${homeClaimName(id)}`]);
        expect(kube.double.livePids(podName(id))).toEqual([]);
        await killDaemon();
        expect(left()).toEqual([`persistentvolumeclaims ${NAMESPACE}/${homeClaimName(id)}`]);
      });
      // Killed: nothing of it is left, its claim included.
      expect(kube.double.objects('persistentvolumeclaims')).toEqual([]);
    }, 240_000);

    test('SDK calls resume a hibernated sandbox; a pause with memory (E2B’s default) is refused with the way out', async () => {
      const home = abx?.home as string;
      const box = await Sandbox.create({ home });
      try {
        const refused = await box.pause().catch((error: Error) => error);
        expect(refused).toBeInstanceOf(Error);
        expect((refused as Error).message).toContain(
          'the kubernetes provider cannot pause a sandbox with its memory (freeze), so the pause is refused; it can hibernate (memory: false)',
        );
        expect((await box.getInfo()).state).toBe('running');
        await box.files.write('a.txt', 'one');
        expect(await box.pause({ memory: false })).toBe(true);
        expect(await box.pause({ memory: false })).toBe(false);
        // A command through the SDK resumes it.
        expect((await box.commands.run('cat a.txt')).stdout).toBe('one');
        expect((await box.getInfo()).state).toBe('running');
        expect(await box.resume()).toBe(false);
        expect(await box.pause({ memory: false })).toBe(true);
        expect(await box.kill()).toBe(true);
        expect((await box.getInfo()).state).toBe('killed');
      } finally {
        await box.kill();
      }
    }, 120_000);

    test('volumes: a claim each, shared by two sandboxes (one read-only), measured, refused while in use, kept across a hibernate, removed with its claim', async () => {
      const made = await call(`${api()}/v1/volumes`, {
        method: 'POST',
        headers: auth,
        body: { name: 'shared', size: '16M' },
      });
      expect(made.status, JSON.stringify(made.body)).toBe(201);
      expect(made.body).toMatchObject({ name: 'shared', sizeBytes: 16 * 1024 * 1024 });
      const claim = volumeClaimName(made.body.volumeId as string);
      expect(kube.double.get('persistentvolumeclaims', NAMESPACE, claim)?.spec.accessModes).toEqual(
        ['ReadWriteMany'],
      );
      const create = async (mount: Json) => {
        const answer = await call(`${api()}/v1/sandboxes`, {
          method: 'POST',
          headers: auth,
          body: { volumeMounts: [mount] },
        });
        expect(answer.status, JSON.stringify(answer.body)).toBe(200);
        return Sandbox.connect(answer.body.sandboxId as string, { home: abx?.home as string });
      };
      const writer = await create({ name: 'shared', path: '/mnt/shared' });
      const reader = await create({ name: 'shared', path: '/home/user/shared', readOnly: true });
      try {
        await writer.commands.run('head -c 2097152 /dev/urandom > /mnt/shared/blob');
        const sum = (await writer.commands.run('sha256sum < /mnt/shared/blob')).stdout;
        expect((await reader.commands.run('sha256sum < ~/shared/blob')).stdout).toBe(sum);
        const denied = await reader.commands.run('touch ~/shared/no 2>&1 || true');
        expect(denied.stdout).toContain('Read-only file system');
        const info = await call(`${api()}/v1/volumes/shared`, { headers: auth });
        expect(info.body).toMatchObject({ totalBytes: 16 * 1024 * 1024, quotaEnforced: true });
        expect(info.body.usedBytes).toBeGreaterThanOrEqual(2 * 1024 * 1024);
        expect([...info.body.usedBy].sort()).toEqual([writer.sandboxId, reader.sandboxId].sort());
        const inUse = await call(`${api()}/v1/volumes/shared`, {
          method: 'DELETE',
          headers: auth,
        });
        expect(inUse.status).toBe(409);
        // A hibernate and resume mounts it again.
        expect(await writer.pause({ memory: false })).toBe(true);
        expect(await writer.resume()).toBe(true);
        expect((await writer.commands.run('sha256sum < /mnt/shared/blob')).stdout).toBe(sum);
      } finally {
        await writer.kill();
        await reader.kill();
      }
      const removed = await call(`${api()}/v1/volumes/shared`, {
        method: 'DELETE',
        headers: auth,
      });
      expect(removed.body).toEqual({ removed: true, name: 'shared' });
      expect(kube.double.get('persistentvolumeclaims', NAMESPACE, claim)).toBeUndefined();
    }, 180_000);

    test('a daemon whose homes are emptyDirs refuses a hibernate, saying why and which setting gives it', async () => {
      const other = await createAbxHome();
      const daemon = new Daemon({
        home: other.home,
        provider: kube.provider({ agentSandbox: false }),
        apiPort: 0,
        gatewayPort: 0,
        warmPool: 0,
      });
      try {
        const info = await daemon.start();
        const key = {
          authorization: `Bearer ${readFileSync(join(other.home, 'api-key'), 'utf8').trim()}`,
        };
        const created = await call(`${info.apiUrl}/v1/sandboxes`, {
          method: 'POST',
          headers: key,
          body: {},
        });
        expect(created.status, JSON.stringify(created.body)).toBe(200);
        const id = created.body.sandboxId as string;
        const hibernate = await call(`${info.apiUrl}/v1/sandboxes/${id}/pause`, {
          method: 'POST',
          headers: key,
          body: { memory: false },
        });
        expect(hibernate.status).toBe(400);
        expect(hibernate.body.error).toContain(
          'the kubernetes provider cannot hibernate a sandbox (pause with memory: false), so the pause is refused: on kubernetes a hibernate keeps only a home on a PersistentVolumeClaim of its own',
        );
        expect(hibernate.body.error).toContain('--kube-home pvc (ABX_KUBE_HOME=pvc)');
        const freeze = await call(`${info.apiUrl}/v1/sandboxes/${id}/pause`, {
          method: 'POST',
          headers: key,
          body: {},
        });
        expect(freeze.status).toBe(400);
        expect(freeze.body.error).toContain('nor can it hibernate (memory: false) here');
        // autoPause with a hibernate is refused at the create, not at the timeout.
        const auto = await call(`${info.apiUrl}/v1/sandboxes`, {
          method: 'POST',
          headers: key,
          body: { autoPause: true, autoPauseMemory: false },
        });
        expect(auto.status).toBe(400);
        await call(`${info.apiUrl}/v1/sandboxes/${id}`, { method: 'DELETE', headers: key });
      } finally {
        await daemon.stop();
        await other.close();
      }
    }, 120_000);
  },
);
