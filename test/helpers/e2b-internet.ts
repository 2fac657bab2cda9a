import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Sandbox } from 'e2b';
import { afterAll, beforeAll } from 'vitest';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { createAbxHome } from './abx-home.js';
import { makeInternet, type TestInternet } from './internet.js';

/** What {@link e2bOnTestInternet} gives a suite once its `beforeAll` ran. */
export interface E2bInternet {
  internet: TestInternet;
  abx: Awaited<ReturnType<typeof createAbxHome>>;
  info: DaemonInfo;
  /** E2B's SDK options with the daemon's admin key. */
  opts: { apiKey: string; requestTimeoutMs: number };
  /** Sandboxes the suite made: killed at its end. */
  made: Sandbox[];
}

/**
 * For a suite (call it inside `describe`): a root daemon whose egress namespace is a test
 * "internet", with E2B's SDK pointed at it through E2B_API_URL and E2B_SANDBOX_URL; with
 * `trustTestCa`, the daemon trusts the internet's CA (NODE_EXTRA_CA_CERTS) for the TLS it opens. Everything is
 * stopped and removed after the suite, whatever happened.
 */
export function e2bOnTestInternet(options: { trustTestCa?: boolean } = {}): E2bInternet {
  const env = { made: [] as Sandbox[] } as E2bInternet;
  beforeAll(async () => {
    env.internet = await makeInternet();
    env.abx = await createAbxHome();
    process.env.ABX_EGRESS_NETNS = env.internet.path;
    process.env.ABX_EGRESS_HOSTS = env.internet.hostsFile;
    // The daemon (and its egress) trusts the test internet's CA, as an operator adds a CA.
    if (options.trustTestCa) process.env.NODE_EXTRA_CA_CERTS = env.internet.caCert;
    try {
      env.info = await startDaemon(env.abx.home);
    } finally {
      delete process.env.NODE_EXTRA_CA_CERTS;
    }
    process.env.E2B_API_URL = env.info.apiUrl;
    process.env.E2B_SANDBOX_URL = env.info.gatewayUrl;
    env.opts = {
      apiKey: readFileSync(join(env.abx.home, 'api-key'), 'utf8').trim(),
      requestTimeoutMs: 60_000,
    };
  }, 120_000);
  afterAll(async () => {
    for (const sandbox of env.made) await sandbox.kill().catch(() => undefined);
    delete process.env.E2B_API_URL;
    delete process.env.E2B_SANDBOX_URL;
    await env.abx?.close();
    env.internet?.remove();
  });
  return env;
}

/** What a command printed, or its failure as `exit N: stdout stderr` (either SDK's sandbox). */
export function outputOf(
  sandbox: {
    commands: { run(command: string, o: { timeoutMs: number }): Promise<{ stdout: string }> };
  },
  command: string,
): Promise<string> {
  return sandbox.commands
    .run(command, { timeoutMs: 30_000 })
    .then((r) => r.stdout)
    .catch(
      (e: { exitCode?: number; stdout?: string; stderr?: string }) =>
        `exit ${e.exitCode}: ${e.stdout ?? ''} ${e.stderr ?? ''}`,
    );
}
