import { execFile } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Templates } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';
import { sampleWhere } from '../helpers/metrics.js';
import { startRootlessOnInternet } from '../helpers/rootless.js';

/**
 * Network bytes in a sandbox's metrics: an internet sandbox of a root and of a rootless daemon,
 * whose egress namespace is a test "internet" (TEST-NET servers on a loopback, no route out),
 * downloads and uploads; an offline sandbox moves bytes over its own loopback only.
 */
const unavailable = internetUnavailable();
const MiB = 1024 ** 2;
const N = 8 * MiB;

interface Installation {
  home: string;
  internet: TestInternet;
  close(): Promise<void>;
}

const modes: [string, () => Promise<Installation>][] = [
  [
    'root daemon',
    async () => {
      const internet = await makeInternet();
      const abx = await createAbxHome();
      process.env.ABX_EGRESS_NETNS = internet.path;
      process.env.ABX_EGRESS_HOSTS = internet.hostsFile;
      process.env.ABX_METRICS_INTERVAL_MS = '200';
      try {
        await startDaemon(abx.home);
      } catch (error) {
        await abx.close();
        internet.remove();
        throw error;
      } finally {
        for (const name of ['ABX_EGRESS_NETNS', 'ABX_EGRESS_HOSTS', 'ABX_METRICS_INTERVAL_MS']) {
          delete process.env[name];
        }
      }
      return {
        home: abx.home,
        internet,
        close: async () => {
          await abx.close();
          internet.remove();
        },
      };
    },
  ],
  [
    'rootless daemon',
    async () => {
      const { daemon, internet } = await startRootlessOnInternet({
        ABX_METRICS_INTERVAL_MS: '200',
      });
      return {
        home: daemon.home,
        internet,
        close: async () => {
          await daemon.close();
          internet.remove();
        },
      };
    },
  ],
];

/** No proxy variables: the traffic is captured in the sandbox's namespace all the same. */
const direct = 'env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy ';

describe.skipIf(unavailable).each(modes)('network bytes in metrics (%s)', (mode, install) => {
  let abx: Installation;
  let templates: string;

  beforeAll(async () => {
    abx = await install();
    templates = mkdtempSync(join(tmpdir(), 'abx-metrics-net-'));
    chmodSync(templates, 0o755);
    writeFileSync(join(templates, 'online.yaml'), 'name: online\nnetwork: internet\n');
    writeFileSync(join(templates, 'offline.yaml'), 'name: offline\nnetwork: none\n');
    await Templates.build(join(templates, 'online.yaml'), { home: abx.home });
    await Templates.build(join(templates, 'offline.yaml'), { home: abx.home });
  }, 300_000);

  afterAll(async () => {
    await abx?.close();
    if (templates) rmSync(templates, { recursive: true, force: true });
  }, 120_000);

  test('an internet sandbox: a download grows netRxBytes, through the proxy (80) and straight through (8080); an upload grows netTxBytes', async () => {
    const box = await Sandbox.create({ home: abx.home, template: 'online' });
    try {
      const before = await sampleWhere(box, 'network counters', (m) => m.netRxBytes !== null);
      const rx0 = before.netRxBytes as number;
      const tx0 = before.netTxBytes as number;

      // Port 80 goes through egress's HTTP proxy; 8080 is raw TCP that only slirp4netns carries.
      for (const port of [80, 8080]) {
        const got = await box.commands.run(
          `${direct}curl -sS -o /dev/null -w '%{size_download}' http://allowed.test:${port}/bytes/${N}`,
          { timeoutMs: 60_000 },
        );
        expect(got.stdout, `port ${port}`).toBe(String(N));
      }
      const downloaded = await sampleWhere(
        box,
        `${2 * N} bytes more received`,
        (m) => (m.netRxBytes as number) >= rx0 + 2 * N,
      );
      // What went out meanwhile is requests and acknowledgements, not the download.
      expect((downloaded.netTxBytes as number) - tx0).toBeLessThan(2 * MiB);
      expect(downloaded.netTxBytes as number).toBeGreaterThan(tx0);

      const sent = await box.commands.run(
        `head -c ${N} /dev/zero | ${direct}curl -sS --data-binary @- http://allowed.test/sink`,
        { timeoutMs: 60_000 },
      );
      expect(sent.stdout).toBe(String(N));
      const uploaded = await sampleWhere(
        box,
        `${N} bytes more sent`,
        (m) => (m.netTxBytes as number) >= (downloaded.netTxBytes as number) + N,
      );
      expect((uploaded.netRxBytes as number) - (downloaded.netRxBytes as number)).toBeLessThan(
        2 * MiB,
      );

      // The CLI shows them in human units.
      const cli = await promisify(execFile)(
        process.execPath,
        [join(ROOT, 'dist', 'cli.js'), 'metrics', box.sandboxId, '--last', '1'],
        { env: { ...process.env, ABX_HOME: abx.home }, timeout: 60_000 },
      );
      const [header, row] = cli.stdout.trim().split('\n');
      expect(header).toMatch(/processes\s+network$/);
      expect(row).toMatch(/\b(1[6-9]|[2-9]\d)\.\d MiB in, (8|9|\d\d)\.\d MiB out$/);
    } finally {
      await box.kill();
    }
  }, 240_000);

  test('an offline sandbox reports 0 bytes, whatever crosses its own loopback', async () => {
    const box = await Sandbox.create({ home: abx.home, template: 'offline' });
    try {
      await box.commands.run(`head -c ${N} /dev/zero > /tmp/big`);
      await box.commands.start('cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1');
      const got = await box.commands.run(
        'for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && break; sleep 0.1; done; ' +
          `curl -sS -o /dev/null -w '%{size_download}' http://127.0.0.1:8000/big`,
        { timeoutMs: 60_000 },
      );
      expect(got.stdout).toBe(String(N));
      // A sample taken after the transfer: still nothing in or out.
      const after = await sampleWhere(box, 'a sample', () => true);
      expect(after.netRxBytes).toBe(0);
      expect(after.netTxBytes).toBe(0);
      expect((await box.getMetrics()).every((m) => m.netRxBytes === 0 && m.netTxBytes === 0)).toBe(
        true,
      );
    } finally {
      await box.kill();
    }
  }, 120_000);

  test.runIf(mode === 'root daemon')(
    "a sandbox on the host's network: not measured, null",
    async () => {
      writeFileSync(join(templates, 'hostnet.yaml'), 'name: hostnet\nnetwork: host\n');
      await Templates.build(join(templates, 'hostnet.yaml'), { home: abx.home });
      const box = await Sandbox.create({ home: abx.home, template: 'hostnet' });
      try {
        const sample = await sampleWhere(box, 'a sample', () => true);
        expect(sample.netRxBytes).toBeNull();
        expect(sample.netTxBytes).toBeNull();
        const cli = await promisify(execFile)(
          process.execPath,
          [join(ROOT, 'dist', 'cli.js'), 'metrics', box.sandboxId, '--last', '1'],
          { env: { ...process.env, ABX_HOME: abx.home }, timeout: 60_000 },
        );
        expect(cli.stdout.trim().split('\n')[1]).toMatch(/not measured \(host network\)$/);
      } finally {
        await box.kill();
      }
    },
    120_000,
  );
});
