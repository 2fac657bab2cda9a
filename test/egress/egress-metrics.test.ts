import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';

/**
 * The daemon's `abx_egress_connections_total` (GET /metrics) against a root daemon whose egress
 * namespace is a test "internet": it moves by what a sandbox's egress allowed and refused, once.
 */
const unavailable = internetUnavailable();

describe.skipIf(unavailable)("the daemon's egress metrics", () => {
  let internet: TestInternet;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let info: DaemonInfo;

  beforeAll(async () => {
    internet = await makeInternet();
    abx = await createAbxHome();
    process.env.ABX_EGRESS_NETNS = internet.path;
    process.env.ABX_EGRESS_HOSTS = internet.hostsFile;
    info = await startDaemon(abx.home);
  }, 120_000);

  afterAll(async () => {
    await abx?.close();
    internet?.remove();
  });

  /** The egress counter's value for one decision, from a scrape parsed with a real parser. */
  async function egress(): Promise<{ allowed: number; refused: number }> {
    const key = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
    const response = await request(`${info.apiUrl}/metrics`, {
      headers: { authorization: `Bearer ${key}` },
    });
    expect(response.statusCode).toBe(200);
    const family = parsePrometheusTextFormat(await response.body.text()).find(
      (f) => f.name === 'abx_egress_connections_total',
    );
    expect(family?.type).toBe('COUNTER');
    const of = (decision: string) =>
      Number(family?.metrics.find((m) => m.labels?.decision === decision)?.value ?? Number.NaN);
    return { allowed: of('allowed'), refused: of('refused') };
  }

  test("counts what a sandbox's egress allowed and refused, once, and keeps it after the sandbox ends", async () => {
    const box = await Sandbox.create({
      home: abx.home,
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    try {
      const before = await egress();
      const sh = (command: string) =>
        box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
      const fetched = await sh('curl -sS -m 10 http://allowed.test/');
      expect(fetched.stdout).toContain('hello from 203.0.113.10');
      expect((await sh('getent hosts denied.test')).exitCode).not.toBe(0);
      const after = await egress();
      // The name's DNS answer and the HTTP request at least; the refused name's question.
      expect(after.allowed - before.allowed).toBeGreaterThanOrEqual(1);
      expect(after.refused - before.refused).toBeGreaterThanOrEqual(1);
      const stats = await box.getNetwork();
      expect(after).toEqual({ allowed: stats.allowed, refused: stats.refused });
      // Nothing new: a second scrape adds nothing.
      expect(await egress()).toEqual(after);
      await box.kill();
      // A counter: the ended sandbox's decisions stay counted.
      expect(await egress()).toEqual(after);
    } finally {
      await box.kill().catch(() => undefined);
    }
  }, 180_000);
});
