import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';

/**
 * The PostgreSQL server the tests may use: `ABX_TEST_DATABASE_URL`, set by .ci/run (and by
 * `export ABX_TEST_DATABASE_URL=$(scripts/test-postgres.sh start)` on a developer's machine).
 * Tests that need it are skipped, saying so, when it is not set.
 */
export const TEST_DATABASE_URL = process.env.ABX_TEST_DATABASE_URL;

/** Appended to the names of suites that need PostgreSQL, when they are skipped. */
export const NEEDS_POSTGRES = TEST_DATABASE_URL
  ? ''
  : ' (skipped: ABX_TEST_DATABASE_URL is not set; see README, "Tests")';

/** `url` with another database name. */
export function withDatabase(url: string, name: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${name}`;
  return parsed.toString();
}

/**
 * A new, empty database on the test server (named at random, so test files running at once never
 * share one); `drop` removes it, closing the connections still open to it.
 */
export async function createTestDatabase(
  serverUrl = TEST_DATABASE_URL as string,
): Promise<{ url: string; name: string; drop(): Promise<void> }> {
  const name = `abx_test_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  return {
    url: withDatabase(serverUrl, name),
    name,
    async drop() {
      const client = new pg.Client({ connectionString: serverUrl });
      await client.connect();
      try {
        await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await client.end();
      }
    },
  };
}

/** A TCP port nothing listens on right now. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const { port } = server.address() as { port: number };
  await new Promise((done) => server.close(done));
  return port;
}

const script = resolve(import.meta.dirname, '../../scripts/test-postgres.sh');
const run = promisify(execFile);

/**
 * A PostgreSQL cluster of the test's own (scripts/test-postgres.sh), to stop and start again:
 * what an outage test needs without touching the server other test files use.
 */
export async function ownCluster(): Promise<{
  url: string;
  stop(): Promise<void>;
  start(): Promise<void>;
  destroy(): Promise<void>;
}> {
  const dir = mkdtempSync(join(tmpdir(), 'abx-pg-'));
  const port = await freePort();
  const start = async () => {
    await run(script, ['start', dir, String(port)]);
  };
  try {
    await start();
  } catch (error) {
    await run(script, ['destroy', dir]).catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    start,
    stop: async () => {
      await run(script, ['stop', dir]);
    },
    destroy: async () => {
      await run(script, ['destroy', dir]);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
