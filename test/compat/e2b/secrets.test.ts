import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Secret, SecretError, SecretNotFoundError } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openSecret, parseSecretsKey } from '../../../src/control/secret-crypto.js';
import { openSqlite } from '../../../src/control/sqlite.js';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { ApiKeys } from '../../../src/sandbox/api-keys.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { call } from '../../helpers/api-call.js';

// The real, unmodified `e2b` package's Secret module against a real daemon, configured only as
// documented: E2B_API_URL for the whole file and the apiKey option.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let adminKey: string;

beforeAll(async () => {
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  process.env.E2B_API_URL = info.apiUrl;
}, 120_000);

afterAll(async () => {
  delete process.env.E2B_API_URL;
  await abx?.close();
}, 120_000);

const as = (apiKey: string) => ({ apiKey, requestTimeoutMs: 30_000 });

/** The current value the daemon keeps for a secret id, opened with the key in its ABX_HOME. */
function storedValue(id: string): string {
  const db = openSqlite(join(abx.home, 'abx.db'));
  try {
    const row = db
      .prepare(
        `SELECT s.id, s.name, v.version, v.sealed FROM secrets s
           JOIN secret_versions v ON v.secret_id = s.id AND v.version = s.version WHERE s.id = ?`,
      )
      .get(id) as { id: string; name: string; version: number; sealed: string };
    const key = parseSecretsKey(readFileSync(join(abx.home, 'secrets-key'), 'utf8'), 'key');
    return openSecret(key, row, row.sealed);
  } finally {
    db.close();
  }
}

describe("E2B's Secret against abx", () => {
  test('create, getInfo (by name and id), update, list, exists, destroy in E2B shapes; values never come back', async () => {
    const admin = as(adminKey);
    const made = await Secret.create('OpenAI-Key', 'sk-e2b-one', {
      ...admin,
      metadata: { team: 'ml' },
    });
    expect(made).toMatchObject({ name: 'openai-key', version: 1, metadata: { team: 'ml' } });
    expect(made.secretId).toMatch(/^sec_/);
    expect(made.createdAt).toBeInstanceOf(Date);
    expect(Math.abs(made.createdAt.getTime() - Date.now())).toBeLessThan(60_000);
    expect(storedValue(made.secretId)).toBe('sk-e2b-one');

    expect(await Secret.getInfo('openai-key', admin)).toEqual(made);
    expect(await Secret.getInfo(made.secretId, admin)).toEqual(made);
    const updated = await Secret.update('openai-key', 'sk-e2b-two', admin);
    expect(updated).toMatchObject({
      secretId: made.secretId,
      version: 2,
      metadata: { team: 'ml' },
    });
    expect(updated.updatedAt.getTime()).toBeGreaterThanOrEqual(made.updatedAt.getTime());
    expect(storedValue(made.secretId)).toBe('sk-e2b-two');
    const relabelled = await Secret.update(made.secretId, 'sk-e2b-three', {
      ...admin,
      metadata: { team: 'ops' },
    });
    expect(relabelled).toMatchObject({ version: 3, metadata: { team: 'ops' } });

    // The same secret on /v1, and no answer of either face holds a value.
    const native = await call(`${info.apiUrl}/v1/secrets/openai-key`, {
      headers: { authorization: `Bearer ${adminKey}` },
    });
    expect(native.body).toMatchObject({ secretId: made.secretId, version: 3 });
    const listedRaw = await call(`${info.apiUrl}/secrets`, { headers: { 'x-api-key': adminKey } });
    expect(listedRaw.body[0]).toEqual({
      secretID: made.secretId,
      name: 'openai-key',
      currentVersion: 3,
      metadata: { team: 'ops' },
      createdAt: made.createdAt.toISOString(),
      updatedAt: relabelled.updatedAt.toISOString(),
    });
    for (const answer of [native, listedRaw]) {
      expect(JSON.stringify(answer.body)).not.toContain('sk-e2b');
    }

    // Pages: limit and X-Next-Token, oldest first.
    await Secret.create('second', 'v', admin);
    await Secret.create('third', 'v', admin);
    const paginator = Secret.list({ ...admin, limit: 2 });
    const pages: string[][] = [];
    while (paginator.hasNext) pages.push((await paginator.nextItems()).map((s) => s.name));
    expect(pages).toEqual([['openai-key', 'second'], ['third']]);

    expect(await Secret.exists('openai-key', admin)).toBe(true);
    expect(await Secret.destroy('openai-key', admin)).toBe(true);
    expect(await Secret.exists('openai-key', admin)).toBe(false);
    expect(await Secret.destroy('openai-key', admin)).toBe(false);
    await expect(Secret.getInfo('openai-key', admin)).rejects.toBeInstanceOf(SecretNotFoundError);
    await expect(Secret.update('openai-key', 'v', admin)).rejects.toBeInstanceOf(
      SecretNotFoundError,
    );
    expect(Secret.fill('openai-key')).toBe('${e2b.secrets.openai-key}');
  });

  test('bad input: a clear 400 or 409 in E2B error shape; another key gets 404 as for no such secret', async () => {
    const admin = as(adminKey);
    await Secret.create('taken', 'v', admin);
    const conflict = await Secret.create('taken', 'other', admin).catch((error: unknown) => error);
    expect(conflict).toBeInstanceOf(SecretError);
    expect((conflict as SecretError).message).toMatch(/^409: a secret named taken exists already/);
    await expect(Secret.create('bad name', 'v', admin)).rejects.toThrow(
      /^400: a secret name is 1 to 64 letters, digits, _, - and \./,
    );
    await expect(Secret.create('empty', '', admin)).rejects.toThrow(
      /^400: value must not be empty/,
    );
    await expect(Secret.create('big', 'x'.repeat(64 * 1024 + 1), admin)).rejects.toThrow(
      /^400: value is 65537 bytes; a secret's value is at most 65536 bytes/,
    );
    await expect(
      Secret.create('empty', 'v', { ...admin, metadata: { n: 1 } as never }),
    ).rejects.toThrow(/^400: metadata.n must be a string/);
    const raw = await call(`${info.apiUrl}/secrets`, {
      method: 'POST',
      headers: { 'x-api-key': adminKey },
      body: { name: 'bad name', value: 'v' },
    });
    expect(raw.status).toBe(400);
    expect(raw.body).toEqual({ code: 400, message: expect.stringMatching(/^a secret name is/) });
    // Nothing was made by the refusals.
    const names = (await Secret.list(admin).nextItems()).map((s) => s.name);
    expect(names).not.toContain('empty');
    expect(names).not.toContain('big');

    const made = await ApiKeys.create('e2b-secrets-bob', { home: abx.home });
    const bob = as(made.key);
    const taken = await Secret.getInfo('taken', admin);
    for (const ref of ['taken', taken.secretId]) {
      await expect(Secret.getInfo(ref, bob)).rejects.toBeInstanceOf(SecretNotFoundError);
      await expect(Secret.update(ref, 'bob', bob)).rejects.toBeInstanceOf(SecretNotFoundError);
      expect(await Secret.exists(ref, bob)).toBe(false);
      expect(await Secret.destroy(ref, bob)).toBe(false);
    }
    expect(await Secret.list(bob).nextItems()).toEqual([]);
    // Bob's own secret of the same name is his.
    expect((await Secret.create('taken', 'bobs', bob)).version).toBe(1);
    expect((await Secret.getInfo('taken', admin)).secretId).toBe(taken.secretId);
    expect(storedValue(taken.secretId)).toBe('v');
    await expect(Secret.create('x', 'v', as('e2b_0000'))).rejects.toThrow(/Unauthorized/);
  });
});
