// `--only webhooks` (bench/README.md, item 17): what registered webhooks cost creates, and how
// soon a delivery arrives (issue 48).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Sandbox, Webhook } from 'abx-sandbox';
import type { BenchReport } from './runner.js';
import { round, summarize } from './stats.js';

/** The repository (this file runs as bench/build/bench/webhooks.js). */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/**
 * A daemon of its own (its own `$ABX_HOME`, `ABX_WEBHOOK_PERMIT=127.0.0.0/8` so a receiver on
 * loopback may be registered; every other webhook setting at its default, polling included):
 * sequential creates per second with no webhook, then with two registered (both taking every
 * event, answered 200 by a receiver on 127.0.0.1), and the delivery latency of those creates'
 * events: the event's time (written with the change) to the receiver's arrival, same clock.
 */
export async function webhookCost(report: BenchReport): Promise<void> {
  const home = mkdtempSync(join(tmpdir(), 'abx-bench-hooks-'));
  const saved = process.env.ABX_WEBHOOK_PERMIT;
  process.env.ABX_WEBHOOK_PERMIT = '127.0.0.0/8';
  const latencies: number[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const arrived = Date.now();
      try {
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        latencies.push(arrived - Date.parse(body.at));
      } catch {
        // not ours
      }
      res.writeHead(200).end();
    });
  });
  try {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
    const creates = report.quick ? 5 : 20;
    const perSecond = async (): Promise<number> => {
      const ids: string[] = [];
      const t0 = performance.now();
      for (let i = 0; i < creates; i++) ids.push((await Sandbox.create({ home })).sandboxId);
      const seconds = (performance.now() - t0) / 1000;
      for (const id of ids) await Sandbox.kill(id, { home });
      return creates / seconds;
    };
    // Untimed: starts the daemon and warms what a first create warms.
    await Sandbox.kill((await Sandbox.create({ home })).sandboxId, { home });
    const none = await perSecond();
    for (const name of ['bench-a', 'bench-b']) await Webhook.create(url, { home, name });
    const two = await perSecond();
    // The last kills' deliveries: a moment for them to arrive.
    const expected = creates * 2 * 2;
    const deadline = Date.now() + 15_000;
    while (latencies.length < expected && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const lat = summarize(latencies);
    report.results.webhooks = {
      creates,
      createsPerSecondNone: round(none, 2),
      createsPerSecondTwoWebhooks: round(two, 2),
      ratio: round(two / none, 2),
      deliveries: latencies.length,
      expected,
      latencyMs: lat,
    };
    report.row(
      '17 webhooks',
      `sequential creates/s with two webhooks vs none (${creates} each)`,
      `${round(two, 2)} vs ${round(none, 2)}`,
      `${round(two / none, 2)}× (1.0: webhooks cost creates nothing)`,
    );
    report.row(
      '17 webhooks',
      'delivery latency: event written → receiver on loopback got it',
      `p50 ${round(lat.p50, 0)} ms`,
      `p99 ${round(lat.p99, 0)} ms; ${latencies.length}/${expected} arrived; woken by each event's write (the 250 ms poll, ABX_WEBHOOK_POLL_MS, as the fallback)`,
    );
  } finally {
    for (const info of await Sandbox.list({ home, state: ['running', 'paused'] }).catch(() => [])) {
      await Sandbox.kill(info.sandboxId, { home }).catch(() => undefined);
    }
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), 'daemon', 'stop'], {
      env: { ...process.env, ABX_HOME: home },
    });
    server.closeAllConnections();
    server.close();
    if (saved === undefined) delete process.env.ABX_WEBHOOK_PERMIT;
    else process.env.ABX_WEBHOOK_PERMIT = saved;
    rmSync(home, { recursive: true, force: true });
  }
}
