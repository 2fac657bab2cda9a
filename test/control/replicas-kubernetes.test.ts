import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { call, type Json } from '../helpers/api-call.js';
import { ROOT } from '../helpers/build.js';
import { kubeDoubles, NAMESPACE, RUNTIME_IMAGE } from '../helpers/kube-fixture.js';
import { createTestDatabase, NEEDS_POSTGRES } from '../helpers/postgres.js';
import { until } from './plane.js';

// Two daemon replicas on one PostgreSQL database and one cluster (the API double), as
// deploy/kubernetes runs them: the same ABX_HOME path and secrets in each, so their pods carry the
// same abx.dev/sandboxes label. (SQLite is one daemon's registry: two daemons cannot share it.)
const kube = kubeDoubles('replicas-kube');
const skipped = kube.unavailable
  ? `: skipped, ${kube.unavailable}`
  : NEEDS_POSTGRES
    ? NEEDS_POSTGRES
    : '';

interface Cluster {
  /** A daemon in this test's process on the shared home and database (stopped after the test). */
  daemon(options?: ReplicaOptions): Promise<{
    daemon: Daemon;
    apiUrl: string;
  }>;
  /** A daemon as its own process (`node dist/daemon.js`), to be SIGKILLed. */
  process(): Promise<{ child: ChildProcess; apiUrl: string; exited: Promise<unknown> }>;
  auth(): Record<string, string>;
}

/** An in-process replica's provider orphan age and reaper sweep period (default: the product's). */
interface ReplicaOptions {
  orphanAgeMs?: number;
  orphanSweepMs?: number;
}

/** Runs `body` with a database, a home and the daemons it starts; all stopped and removed after. */
async function withCluster(body: (cluster: Cluster) => Promise<void>): Promise<void> {
  const database = await createTestDatabase();
  const home = mkdtempSync(join(kube.scratch, 'home-'));
  const kubeconfig = join(kube.scratch, 'kubeconfig');
  writeFileSync(kubeconfig, kube.double.kubeConfig(NAMESPACE).exportConfig());
  const daemons: Daemon[] = [];
  const children: ChildProcess[] = [];
  try {
    await body({
      async daemon(options = {}) {
        const daemon = new Daemon({
          home,
          provider: kube.provider({
            agentSandbox: false,
            ...(options.orphanAgeMs === undefined ? {} : { orphanAgeMs: options.orphanAgeMs }),
          }),
          databaseUrl: database.url,
          warmPool: 0,
          reapIntervalMs: 50,
          ...(options.orphanSweepMs === undefined ? {} : { orphanSweepMs: options.orphanSweepMs }),
        });
        daemons.push(daemon);
        return { daemon, apiUrl: (await daemon.start()).apiUrl };
      },
      async process() {
        const child = spawn(process.execPath, [join(ROOT, 'dist', 'daemon.js')], {
          env: {
            ...process.env,
            ABX_HOME: home,
            ABX_DATABASE_URL: database.url,
            ABX_PROVIDER: 'kubernetes',
            KUBECONFIG: kubeconfig,
            ABX_KUBE_NAMESPACE: NAMESPACE,
            ABX_KUBE_RUNTIME_IMAGE: RUNTIME_IMAGE,
            ABX_KUBE_AGENT_SANDBOX: 'false',
            ABX_WARM_POOL: '0',
          },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        children.push(child);
        const exited = new Promise((resolve) => child.once('exit', resolve));
        let stderr = '';
        child.stderr?.on('data', (chunk) => {
          stderr += chunk;
        });
        const apiUrl = await new Promise<string>((resolve, reject) => {
          createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (line) => {
            const event = JSON.parse(line) as Json;
            if (event.event === 'listening') resolve(event.apiUrl);
          });
          void exited.then(() => reject(new Error(`the daemon exited: ${stderr}`)));
        });
        return { child, apiUrl, exited };
      },
      auth: () => ({
        authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
      }),
    });
  } finally {
    for (const child of children) {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGKILL');
        await exited;
      }
    }
    for (const daemon of daemons) await daemon.stop().catch(() => undefined);
    // Whatever a failed test left in the cluster goes with it (the double runs its processes).
    kube.double.fate = () => ({ kind: 'run' });
    await kube.provider({ agentSandbox: false }).sweepOrphans(join(home, 'sandboxes'), new Set());
    await database.drop();
    rmSync(home, { recursive: true, force: true });
  }
}

/** Holds every new pod Pending until `release` is called. */
function holdPods(): () => void {
  let release = () => {};
  const until = new Promise<void>((resolve) => {
    release = resolve;
  });
  kube.double.fate = () => ({ kind: 'hold', until });
  return release;
}

const sandboxObjects = () => kube.double.objects().filter((object) => !object.startsWith('events'));

describe.skipIf(skipped !== '')(`two daemon replicas on one cluster${skipped}`, () => {
  test('a replica killed mid-create: the other deletes the pod and Secret it left, and no row says the sandbox exists', async () => {
    await withCluster(async (cluster) => {
      const a = await cluster.process();
      // The orphan age stands for the start timeout + margin (minutes by default).
      const b = await cluster.daemon({ orphanAgeMs: 3000, orphanSweepMs: 200 });
      const release = holdPods();
      const creating = call(`${a.apiUrl}/v1/sandboxes`, {
        method: 'POST',
        headers: cluster.auth(),
      }).then(
        (answer) => answer,
        (error: Error) => error,
      );
      await until(
        () => kube.double.objects('secrets').length === 1,
        'the pod and Secret of the create under way',
        30_000,
      );
      const [pod] = kube.double.objects('pods');
      expect(pod).toMatch(/^pods sandboxes\/abx-/);
      a.child.kill('SIGKILL');
      await a.exited;
      // The caller of the create is told it failed (the connection closed under it; or, on a
      // machine slow enough that b swept first, the start failed).
      const answer = await creating;
      expect(answer instanceof Error || answer.status >= 500).toBe(true);
      // The held pod now starts for real: an orphan that runs until b's reaper sweeps it.
      release();
      await until(
        () => sandboxObjects().length === 0 && kube.double.livePids().length === 0,
        `b's reaper to delete the orphan (left: ${sandboxObjects().join(', ')})`,
        60_000,
      );
      const id = (pod as string).replace(/^pods sandboxes\/abx-/, '');
      const found = await call(`${b.apiUrl}/v1/sandboxes/${id}`, { headers: cluster.auth() });
      expect(found.status).toBe(404);
      const listed = await call(`${b.apiUrl}/v1/sandboxes`, { headers: cluster.auth() });
      expect(listed.body.sandboxes).toEqual([]);
    });
  }, 120_000);

  test('a replica that starts while another creates leaves that create alone; it finishes', async () => {
    await withCluster(async (cluster) => {
      const a = await cluster.daemon();
      const release = holdPods();
      const creating = call(`${a.apiUrl}/v1/sandboxes`, {
        method: 'POST',
        headers: cluster.auth(),
      });
      await until(
        () => kube.double.objects('secrets').length === 1,
        'the pod and Secret of the create under way',
        30_000,
      );
      // b's start sweeps the cluster for orphans: a pod this young may be a create under way.
      const b = await cluster.daemon();
      expect(kube.double.objects('pods')).toHaveLength(1);
      release();
      const created = await creating;
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const { sandboxId, accessToken } = created.body;
      const connected = await call(`${b.apiUrl}/v1/sandboxes/${sandboxId}/connect`, {
        method: 'POST',
        headers: cluster.auth(),
      });
      expect(connected.body).toMatchObject({ sandboxId, accessToken, state: 'running' });
      const killed = await call(`${b.apiUrl}/v1/sandboxes/${sandboxId}`, {
        method: 'DELETE',
        headers: cluster.auth(),
      });
      expect(killed.body).toMatchObject({ killed: true });
      expect(sandboxObjects()).toEqual([]);
    });
  }, 90_000);
});
