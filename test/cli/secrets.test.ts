import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openSecret, parseSecretsKey } from '../../src/control/secret-crypto.js';
import { openSqlite } from '../../src/control/sqlite.js';
import { Secret, SecretConflictError, SecretNotFoundError } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { abxIn } from './abx.js';

let home: Awaited<ReturnType<typeof createAbxHome>>;
let cli: ReturnType<typeof abxIn>;

beforeAll(async () => {
  home = await createAbxHome();
  cli = abxIn(home.home);
});

afterAll(async () => {
  await home?.close();
});

/** The current value of a secret of the daemon's key, opened from the registry as the daemon would. */
function storedValue(name: string): string {
  const db = openSqlite(join(home.home, 'abx.db'));
  try {
    const row = db
      .prepare(
        `SELECT s.id, s.name, v.version, v.sealed FROM secrets s
           JOIN secret_versions v ON v.secret_id = s.id AND v.version = s.version
           WHERE s.owner_key = '' AND s.name = ?`,
      )
      .get(name) as { id: string; name: string; version: number; sealed: string };
    const key = parseSecretsKey(readFileSync(join(home.home, 'secrets-key'), 'utf8'), 'key');
    return openSecret(key, row, row.sealed);
  } finally {
    db.close();
  }
}

const FIRST = 'ghp_first_0123456789abcdef';
const SECOND = 'ghp_second_fedcba9876543210';

describe('abx secret', () => {
  test('create from stdin or a file, list, info, update, rm: the value is never printed, logged or taken from the command line', async () => {
    const made = await cli.abx(
      ['secret', 'create', 'GitHub', '--value-stdin', '--meta', 'team=infra'],
      {
        input: `${FIRST}\n`,
      },
    );
    expect(made.stderr).toBe('');
    expect(made.code).toBe(0);
    expect(made.stdout).toBe('made secret github (version 1)\n');
    // What the daemon keeps opens (with the key in $ABX_HOME) to the value without echo's newline.
    expect(storedValue('github')).toBe(FIRST);

    const file = join(home.home, 'token.txt');
    writeFileSync(file, `${SECOND}\n`, { mode: 0o600 });
    const fromFile = await cli.json<{ name: string; version: number }>([
      'secret',
      'create',
      'other',
      '--value-file',
      file,
    ]);
    expect(fromFile).toMatchObject({ name: 'other', version: 1 });

    const list = await cli.abx(['secret', 'list']);
    expect(list.code).toBe(0);
    const lines = list.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^NAME\s+VERSION\s+UPDATED\s+METADATA\s+OWNER\s+ID$/);
    expect(lines[1]).toMatch(/^github\s+1\s+.*team=infra\s+\(daemon key\)\s+sec_[0-9a-f]{20}$/);
    expect(lines[2]).toMatch(/^other\s+1\s/);

    const updated = await cli.abx(['secret', 'update', 'github', '--value-stdin'], {
      input: SECOND,
    });
    expect(updated.stdout).toBe('updated secret github (version 2)\n');
    expect(storedValue('github')).toBe(SECOND);
    expect(storedValue('other')).toBe(SECOND);
    const relabelled = await cli.abx(['secret', 'update', 'github', '--meta', 'team=ops']);
    expect(relabelled.stdout).toBe('updated secret github (version 2)\n');
    const info = await cli.abx(['secret', 'info', 'github']);
    expect(info.stdout).toMatch(/^version:\s+2$/m);
    expect(info.stdout).toMatch(/^metadata:\s+team=ops$/m);

    // No value on the command line: without --value-stdin or --value-file it is a usage error.
    const bare = await cli.abx(['secret', 'create', 'bare']);
    expect(bare.code).toBe(2);
    expect(bare.stderr).toContain(
      'give the value on stdin (--value-stdin, e.g. from a password manager: pass show openai | abx secret create openai --value-stdin) or in a file (--value-file F)',
    );
    const inline = await cli.abx(['secret', 'create', 'bare', '--value', FIRST]);
    expect(inline.code).toBe(2);
    expect(inline.stderr).toContain("unknown option '--value'");
    const badName = await cli.abx(['secret', 'create', 'bad name', '--value-stdin'], {
      input: 'x',
    });
    expect(badName.code).toBe(2);
    expect(badName.stderr).toContain(
      'a secret name is 1 to 64 letters, digits, _, - and ., starting with a letter or digit',
    );
    const empty = await cli.abx(['secret', 'create', 'empty', '--value-stdin'], { input: '\n' });
    expect(empty.code).toBe(2);
    expect(empty.stderr).toContain('value must not be empty');

    const help = await cli.abx(['secret', 'create', '--help']);
    expect(help.stdout).toContain('--value-stdin');
    expect(help.stdout).toContain('--value-file <file>');
    expect(help.stdout).toContain('pass show openai | abx secret create openai --value-stdin');

    expect((await cli.abx(['secret', 'rm', 'github', 'other'])).stdout).toBe(
      'removed secret github\nremoved secret other\n',
    );
    const gone = await cli.abx(['secret', 'rm', 'github']);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toContain('SecretNotFoundError: no secret named github');

    // Nothing the CLI printed, nor the daemon's log, holds a value.
    const everything = [made, fromFile, list, updated, relabelled, info, bare, inline, gone]
      .map((r) => JSON.stringify(r))
      .join('\n');
    const log = readFileSync(join(home.home, 'daemon.log'), 'utf8');
    for (const value of [FIRST, SECOND]) {
      expect(everything).not.toContain(value);
      expect(log).not.toContain(value);
    }
  });

  test('the SDK: Secret.create, update, getInfo, list, exists, destroy', async () => {
    const options = { home: home.home };
    const made = await Secret.create('sdk-secret', 'v1-value', {
      ...options,
      metadata: { a: '1' },
    });
    expect(made).toMatchObject({ name: 'sdk-secret', version: 1, metadata: { a: '1' } });
    expect(JSON.stringify(made)).not.toContain('v1-value');
    await expect(Secret.create('sdk-secret', 'again', options)).rejects.toBeInstanceOf(
      SecretConflictError,
    );
    const updated = await Secret.update('SDK-Secret', 'v2-value', options);
    expect(updated).toMatchObject({ version: 2, metadata: { a: '1' } });
    expect(await Secret.getInfo(made.secretId, options)).toMatchObject({
      name: 'sdk-secret',
      version: 2,
    });
    expect((await Secret.list(options)).map((s) => s.name)).toContain('sdk-secret');
    expect(await Secret.exists('sdk-secret', options)).toBe(true);
    expect(await Secret.destroy('sdk-secret', options)).toBe(true);
    expect(await Secret.exists('sdk-secret', options)).toBe(false);
    expect(await Secret.destroy('sdk-secret', options)).toBe(false);
    await expect(Secret.getInfo('sdk-secret', options)).rejects.toBeInstanceOf(SecretNotFoundError);
  });
});
