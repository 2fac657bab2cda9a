import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { type DaemonInfo, Sandbox } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { call } from '../helpers/api-call.js';
import { MemoryProvider } from '../helpers/memory-provider.js';
import { until } from './plane.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
}, 300_000);

afterAll(async () => {
  await abx?.close();
});

const daemonInfo = () => JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo;
const adminKey = () => readFileSync(join(home, 'api-key'), 'utf8').trim();

/** One scrape, as Prometheus sends it (its `authorization` setting sends a Bearer key). */
async function scrape(headers: Record<string, string> = { authorization: `Bearer ${adminKey()}` }) {
  const response = await request(`${daemonInfo().apiUrl}/metrics`, { headers });
  return {
    status: response.statusCode,
    headers: response.headers,
    text: await response.body.text(),
  };
}

/** A metric's value: the sample of `name` whose labels include `labels` (0 when there is none). */
type Parsed = ReturnType<typeof parsePrometheusTextFormat>;
function value(parsed: Parsed, name: string, labels: Record<string, string> = {}): number {
  // A family's lines that another family's lines interrupt come as a family of their own again.
  const samples = parsed.filter((f) => f.name === name).flatMap((f) => f.metrics);
  const sample = samples.find((m) =>
    Object.entries(labels).every(([key, v]) => m.labels?.[key] === v),
  );
  return sample?.value === undefined ? 0 : Number(sample.value);
}

/**
 * The scrape parsed. parse-prometheus-text-format folds a histogram's series into one and drops
 * their labels (it follows prom2json, which has no labelled histograms): the create histogram is
 * read as plain series (`_bucket`, `_sum`, `_count`, each with its labels) instead.
 */
async function metrics(): Promise<Parsed> {
  const { status, text } = await scrape();
  expect(status).toBe(200);
  return parsePrometheusTextFormat(
    text.replace(
      '# TYPE abx_sandbox_create_seconds histogram',
      '# TYPE abx_sandbox_create_seconds untyped',
    ),
  );
}

describe("the daemon's Prometheus metrics (GET /metrics)", () => {
  test('count the creates, kills, gateway requests and reaper passes a real daemon saw', async () => {
    // The first create starts the daemon; its sandbox is not counted in `before`.
    const first = await Sandbox.create({ home });
    let second: Sandbox | undefined;
    try {
      const before = await metrics();
      expect(value(before, 'abx_sandboxes', { state: 'running', template: 'base' })).toBe(1);
      expect(
        value(before, 'abx_sandbox_creates_total', { template: 'base', source: 'start' }),
      ).toBe(1);
      expect(value(before, 'abx_warm_pool_misses_total', { template: 'base' })).toBe(1);
      // The create asked the warm pool of base for a spare: it refills one in the background.
      await until(
        async () =>
          value(await metrics(), 'abx_sandboxes', { state: 'pooled', template: 'base' }) === 1,
        'the warm pool of base to hold a spare',
        60_000,
      );
      const pooled = await metrics();
      expect(value(pooled, 'abx_warm_pool_size', { template: 'base' })).toBeGreaterThanOrEqual(1);

      second = await Sandbox.create({ home });
      const { gatewayUrl } = daemonInfo();
      // One request to envd through the gateway (the connection closed after it, so its bytes
      // are counted), and one that names no sandbox.
      const health = await request(`${gatewayUrl}/health`, {
        headers: {
          host: `49983-${first.sandboxId}.localhost`,
          'x-access-token': first.accessToken,
        },
        reset: true,
      });
      expect(health.statusCode).toBe(200);
      const healthBody = await health.body.text();
      const invalid = await request(`${gatewayUrl}/health`, { reset: true });
      expect(invalid.statusCode).toBe(400);
      await invalid.body.text();
      // Forks are creates too, of their source's template.
      const forks = await first.fork({ count: 2 });
      for (const fork of forks) await fork.kill();
      expect(await Sandbox.kill(first.sandboxId, { home })).toBe(true);

      let after = await metrics();
      await until(
        async () => {
          after = await metrics();
          return (
            value(after, 'abx_gateway_bytes_total', { direction: 'out' }) >=
            value(pooled, 'abx_gateway_bytes_total', { direction: 'out' }) + healthBody.length
          );
        },
        "the gateway's closed connections to be counted",
        10_000,
      );
      const moved = (name: string, labels: Record<string, string> = {}) =>
        value(after, name, labels) - value(pooled, name, labels);
      expect(moved('abx_sandbox_creates_total', { template: 'base', source: 'pool' })).toBe(1);
      expect(moved('abx_sandbox_creates_total', { template: 'base', source: 'start' })).toBe(0);
      expect(moved('abx_sandbox_creates_total', { template: 'base', source: 'fork' })).toBe(2);
      expect(moved('abx_sandbox_create_seconds_count', { source: 'fork' })).toBe(2);
      expect(moved('abx_warm_pool_hits_total', { template: 'base' })).toBe(1);
      expect(moved('abx_sandbox_create_seconds_count', { source: 'pool' })).toBe(1);
      expect(moved('abx_sandbox_create_seconds_bucket', { source: 'pool', le: '+Inf' })).toBe(1);
      expect(moved('abx_sandbox_create_seconds_sum', { source: 'pool' })).toBeGreaterThan(0);
      expect(moved('abx_sandbox_ends_total', { state: 'killed' })).toBe(3);
      expect(value(after, 'abx_sandbox_create_failures_total', { template: 'base' })).toBe(0);
      expect(moved('abx_gateway_requests_total', { kind: 'envd' })).toBeGreaterThanOrEqual(1);
      expect(moved('abx_gateway_requests_total', { kind: 'invalid' })).toBe(1);
      expect(moved('abx_gateway_bytes_total', { direction: 'in' })).toBeGreaterThan(0);
      // The killed sandbox left the gauge; the one from the pool is running.
      expect(value(after, 'abx_sandboxes', { state: 'running', template: 'base' })).toBe(1);
      expect(
        after
          .find((f) => f.name === 'abx_sandboxes')
          ?.metrics.every((m) => m.labels?.state !== 'killed'),
      ).toBe(true);
      // The reaper passes every second.
      await until(
        async () =>
          value(await metrics(), 'abx_reaper_passes_total') >
          value(before, 'abx_reaper_passes_total'),
        'a reaper pass',
        10_000,
      );
      expect(value(after, 'abx_reaper_failures_total')).toBe(0);
      // Node's process metrics, under the daemon's prefix.
      expect(value(after, 'abx_process_resident_memory_bytes')).toBeGreaterThan(0);
      expect(after.find((f) => f.name === 'abx_nodejs_heap_size_used_bytes')?.type).toBe('GAUGE');
      expect(after.find((f) => f.name === 'abx_sandbox_ends_total')?.type).toBe('COUNTER');
    } finally {
      await Sandbox.kill(first.sandboxId, { home }).catch(() => undefined);
      if (second) await Sandbox.kill(second.sandboxId, { home }).catch(() => undefined);
    }
  }, 180_000);

  test('answer an admin key only: 401 without a key, 403 for a key that is not an admin', async () => {
    const admin = { authorization: `Bearer ${adminKey()}` };
    const ok = await scrape();
    expect(ok.status).toBe(200);
    expect(ok.headers['content-type']).toBe('text/plain; version=0.0.4; charset=utf-8');
    // X-API-KEY, as E2B's API takes it, does too.
    expect((await scrape({ 'x-api-key': adminKey() })).status).toBe(200);

    const none = await call(`${daemonInfo().apiUrl}/metrics`);
    expect(none.status).toBe(401);
    expect(none.body).toMatchObject({ type: 'AuthenticationError' });
    expect(none.body.error).toContain('X-API-KEY');

    const made = await call(`${daemonInfo().apiUrl}/v1/keys`, {
      method: 'POST',
      headers: admin,
      body: { name: 'scraper' },
    });
    expect(made.status).toBe(200);
    for (const headers of <Record<string, string>[]>[
      { authorization: `Bearer ${made.body.key}` },
      { 'x-api-key': made.body.key },
    ]) {
      const refused = await call(`${daemonInfo().apiUrl}/metrics`, { headers });
      expect(refused.status).toBe(403);
      expect(refused.body).toMatchObject({ type: 'PermissionDeniedError', code: 'admin_required' });
      expect(refused.body.error).toContain(
        "GET /metrics (the daemon's Prometheus metrics) needs an admin API key",
      );
    }
  }, 120_000);
});

describe('create failures and ends by state (a daemon on the memory provider)', () => {
  test("count the daemon's failed creates, not refused ones, and each way a sandbox ends", async () => {
    const provider = new MemoryProvider();
    const dir = mkdtempSync(join(tmpdir(), 'abx-prometheus-'));
    const daemon = new Daemon({ home: dir, provider, reapIntervalMs: 50, warmPool: 0 });
    try {
      const info = await daemon.start();
      const headers = {
        authorization: `Bearer ${readFileSync(join(dir, 'api-key'), 'utf8').trim()}`,
      };
      const create = (body: unknown) =>
        call(`${info.apiUrl}/v1/sandboxes`, { method: 'POST', headers, body });
      const scraped = async () => {
        const response = await call(`${info.apiUrl}/metrics`, { headers });
        expect(response.status).toBe(200);
        return parsePrometheusTextFormat(response.body);
      };

      provider.failNextCreate(new Error('the provider could not start it'));
      expect((await create({})).status).toBe(500);
      expect((await create({ template: 'nosuchtemplate' })).status).toBe(404);
      expect((await create({ timeoutMs: -1 })).status).toBe(400);
      const killed = (await create({})).body.sandboxId;
      const dead = (await create({})).body.sandboxId;
      const expiring = (await create({ timeoutMs: 1000 })).body.sandboxId;
      expect(
        (await call(`${info.apiUrl}/v1/sandboxes/${killed}`, { method: 'DELETE', headers })).status,
      ).toBe(200);
      await provider.die(dead, 'exited');
      await until(
        async () => {
          const parsed = await scraped();
          return (
            value(parsed, 'abx_sandbox_ends_total', { state: 'dead' }) === 1 &&
            value(parsed, 'abx_sandbox_ends_total', { state: 'expired' }) === 1
          );
        },
        `sandbox ${dead} found dead and ${expiring} expired by the reaper`,
        10_000,
      );
      const parsed = await scraped();
      expect(value(parsed, 'abx_sandbox_create_failures_total', { template: 'base' })).toBe(1);
      expect(
        parsed
          .find((f) => f.name === 'abx_sandbox_create_failures_total')
          ?.metrics.map((m) => m.labels?.template),
      ).toEqual(['base']);
      expect(
        value(parsed, 'abx_sandbox_creates_total', { template: 'base', source: 'start' }),
      ).toBe(3);
      expect(value(parsed, 'abx_sandbox_ends_total', { state: 'killed' })).toBe(1);
      // No warm pool: no create missed it.
      expect(value(parsed, 'abx_warm_pool_misses_total', { template: 'base' })).toBe(0);
      expect(value(parsed, 'abx_sandboxes', { state: 'running', template: 'base' })).toBe(0);
    } finally {
      await daemon.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
