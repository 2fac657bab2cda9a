import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { ApiKeyInfo } from '../../src/index.js';
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

/** `abx` as a client of the daemon's API with `key`, as a remote client would run it. */
function as(key: string) {
  const { apiUrl } = JSON.parse(readFileSync(join(home.home, 'daemon.json'), 'utf8'));
  return (args: string[]) =>
    cli.abx(args, { env: { ABX_API_URL: apiUrl, ABX_API_KEY: key, ABX_HOME: '/nonexistent' } });
}

describe('abx keys create, list, revoke', () => {
  test('keys made with the CLI are isolated, limited and revoked, on real sandboxes', async () => {
    // The daemon's own key (this host's CLI) is the admin that makes the others.
    const plain = await cli.abx(['keys', 'create', '--name', 'alice']);
    expect(plain.code).toBe(0);
    const aliceKey = plain.stdout.trim();
    expect(plain.stdout).toMatch(/^abx_[A-Za-z0-9_-]{43}\n$/);
    expect(plain.stderr).toMatch(
      /^made API key 'alice' \(key_[a-z0-9]{12}\): keep it now, it is not shown again/,
    );
    const ci = await cli.json<ApiKeyInfo & { key: string }>([
      'keys',
      'create',
      '--name',
      'ci',
      '--max-running',
      '1',
    ]);
    expect(ci).toMatchObject({ name: 'ci', maxRunning: 1, admin: false, revokedAt: null });

    const asCi = as(ci.key);
    const asAlice = as(aliceKey);
    const created = await asCi(['create', '-q']);
    expect(created.code).toBe(0);
    const id = created.stdout.trim();
    expect((await asCi(['exec', id, '--', 'echo', 'hi'])).stdout).toBe('hi\n');

    const over = await asCi(['create', '-q']);
    expect(over.code).toBe(1);
    expect(over.stderr).toContain(
      `abx: LimitExceededError: the API key 'ci' (${ci.id}) has 1 sandbox running, its limit (--max-running)`,
    );
    expect(over.stderr).toContain('hint: `abx list` shows the sandboxes running under this key');

    // Alice sees nothing of ci's sandbox, and cannot end it.
    expect((await asAlice(['list'])).stdout).not.toContain(id);
    const kill = await asAlice(['kill', id]);
    expect(kill.code).toBe(1);
    expect(kill.stderr).toContain(`SandboxNotFoundError: sandbox ${id} does not exist`);
    expect((await asCi(['info', id])).stdout).toMatch(/^state:\s+running$/m);

    const refused = await asAlice(['keys', 'list']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(
      "abx: PermissionDeniedError: listing the API keys needs an admin API key, and the key 'alice'",
    );

    const table = await cli.abx(['keys', 'list']);
    expect(table.code).toBe(0);
    const lines = table.stdout.trim().split('\n');
    expect(lines[0]).toMatch(
      /^ID\s+NAME\s+PREFIX\s+ADMIN\s+RUNNING\s+LIMIT\s+CREATED\s+LAST USED\s+REVOKED$/,
    );
    expect(lines).toContainEqual(
      expect.stringMatching(new RegExp(`^${ci.id}\\s+ci\\s+${ci.prefix}…\\s+no\\s+1\\s+1\\s`)),
    );
    expect(table.stdout).not.toContain(ci.key);

    const revoked = await cli.abx(['keys', 'revoke', ci.id]);
    expect(revoked).toMatchObject({ code: 0, stdout: `revoked API key 'ci' (${ci.id})\n` });
    const after = await asCi(['list']);
    expect(after.code).toBe(1);
    expect(after.stderr).toContain(`the API key 'ci' (${ci.id}, ${ci.prefix}…) was revoked at`);
    const listed = await cli.json<ApiKeyInfo[]>(['keys', 'list']);
    expect(listed.map((k) => [k.name, k.revokedAt === null])).toEqual([
      ['alice', true],
      ['ci', false],
    ]);

    const unknown = await cli.abx(['keys', 'revoke', 'key_nosuchkey000']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain('NotFoundError: no API key has the id "key_nosuchkey000"');
    // A dozen abx processes one after the other: minutes on a loaded machine, not a hang.
  }, 180_000);

  test('templates and snapshots have owners (abx snapshot, template build|list|publish); keys revoke --kill ends the sandboxes', async () => {
    const make = async (name: string) =>
      cli.json<ApiKeyInfo & { key: string }>(['keys', 'create', '--name', name]);
    const [alice, bob] = [await make('tpl-alice'), await make('tpl-bob')];
    const [asAlice, asBob] = [as(alice.key), as(bob.key)];
    // Alice snapshots her own sandbox, with a file in it: the template is hers.
    const source = (await asAlice(['create', '-q'])).stdout.trim();
    const wrote = await asAlice(['exec', source, '--', 'sh', '-c', 'echo alice only > secret.txt']);
    expect(wrote.code, wrote.stderr).toBe(0);
    const saved = await asAlice(['snapshot', source, 'alice-snap']);
    expect(saved.code, saved.stderr).toBe(0);
    const copy = (await asAlice(['create', '-q', '--template', 'alice-snap'])).stdout.trim();
    expect((await asAlice(['exec', copy, '--', 'cat', 'secret.txt'])).stdout).toBe('alice only\n');
    const aliceList = (await asAlice(['template', 'list'])).stdout;
    expect(aliceList).toMatch(/^NAME\s+SHARED\s+CAPABILITIES/);
    expect(aliceList).toMatch(new RegExp(`^alice-snap\\s+no \\(${alice.id}\\)\\s`, 'm'));

    // Bob neither lists it nor starts it: it answers as a name that is not built.
    expect((await asBob(['template', 'list'])).stdout).not.toContain('alice-snap');
    const refused = await asBob(['create', '-q', '--template', 'alice-snap']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(
      "abx: TemplateNotFoundError: template 'alice-snap' is not built; known templates: base.",
    );
    const taken = await asBob([
      'snapshot',
      (await asBob(['create', '-q'])).stdout.trim(),
      'alice-snap',
    ]);
    expect(taken.code).toBe(1);
    expect(taken.stderr).toContain(
      "abx: TemplateConflictError: the template name 'alice-snap' is taken by a template this key cannot see: choose another name",
    );
    // Only an admin shares it.
    const notAdmin = await asAlice(['template', 'publish', 'alice-snap']);
    expect(notAdmin.code).toBe(1);
    expect(notAdmin.stderr).toContain(
      "abx: PermissionDeniedError: publishing template 'alice-snap' (or taking it out of the shared catalogue) needs an admin API key, and the key 'tpl-alice'",
    );
    const published = await cli.abx(['template', 'publish', 'alice-snap']);
    expect(published).toMatchObject({
      code: 0,
      stdout: "template 'alice-snap' is shared: every key lists it and creates sandboxes from it\n",
    });
    expect((await asBob(['template', 'list'])).stdout).toMatch(/^alice-snap\s+yes\s/m);
    const bobs = (await asBob(['create', '-q', '--template', 'alice-snap'])).stdout.trim();
    expect((await asBob(['exec', bobs, '--', 'cat', 'secret.txt'])).stdout).toBe('alice only\n');
    const back = await cli.abx(['template', 'publish', 'alice-snap', '--unpublish']);
    expect(back.stdout).toBe(
      `template 'alice-snap' is no longer shared: only its owner (${alice.id}) and admin keys see it\n`,
    );
    expect((await asBob(['template', 'list'])).stdout).not.toContain('alice-snap');
    const help = await cli.abx(['template', 'publish', '--help']);
    expect(help.stdout).toContain('--unpublish');
    expect(help.stdout).toContain('Needs an admin key.');

    // Her own build (the YAML's text goes to the control plane), its setup run off the host's
    // network; a host-network template is an admin's to build.
    const yaml = join(home.home, 'alice-built.yaml');
    writeFileSync(yaml, 'name: alice-built\nsetup:\n  - echo built by alice > built.txt\n');
    const built = await asAlice(['template', 'build', yaml]);
    expect(built.code, built.stderr).toBe(0);
    const fromBuilt = (await asAlice(['create', '-q', '--template', 'alice-built'])).stdout.trim();
    expect((await asAlice(['exec', fromBuilt, '--', 'cat', 'built.txt'])).stdout).toBe(
      'built by alice\n',
    );
    expect((await asBob(['template', 'list'])).stdout).not.toContain('alice-built');
    writeFileSync(yaml, 'name: alice-host\nnetwork: host\n');
    const host = await asAlice(['template', 'build', yaml]);
    expect(host.code).toBe(1);
    expect(host.stderr).toContain(
      "abx: PermissionDeniedError: template 'alice-host' has network: host (the daemon host's own network): building that needs an admin API key",
    );

    // Revoked with --kill: her sandboxes end at once, bob's run on.
    const revoked = await cli.abx(['keys', 'revoke', alice.id, '--kill']);
    expect(revoked.code, revoked.stderr).toBe(0);
    expect(revoked.stdout).toMatch(
      new RegExp(
        `^revoked API key 'tpl-alice' \\(${alice.id}\\)\\nkilled its 3 sandboxes: \\S+ \\S+ \\S+\\n$`,
      ),
    );
    expect(revoked.stdout).toContain(source);
    expect(revoked.stdout).toContain(copy);
    for (const id of [source, copy]) {
      expect((await cli.abx(['info', id])).stdout).toMatch(/^state:\s+killed$/m);
    }
    expect((await asBob(['exec', bobs, '--', 'echo', 'still'])).stdout).toBe('still\n');
    expect((await cli.abx(['keys', 'revoke', '--help'])).stdout).toMatch(
      /--kill\s+also kill the key's running and paused sandboxes: their tokens\s+stop working at the gateway at once/,
    );
    await cli.abx(['template', 'rm', 'alice-snap']);
    await cli.abx(['template', 'rm', 'alice-built']);
  }, 240_000);

  test('usage: --name is required, --max-running takes a count, --help shows examples', async () => {
    const noName = await cli.abx(['keys', 'create']);
    expect(noName.code).toBe(2);
    expect(noName.stderr).toContain("required option '--name <name>' not specified");
    const badCount = await cli.abx(['keys', 'create', '--name', 'x', '--max-running', '0']);
    expect(badCount.code).toBe(2);
    expect(badCount.stderr).toContain('expected a whole number of sandboxes, 1 or more.');
    const help = await cli.abx(['keys', 'create', '--help']);
    expect(help.stdout).toContain('abx keys create --name ci --max-running 5 --json');
    expect((await cli.json<ApiKeyInfo[]>(['keys', 'list'])).map((k) => k.name)).not.toContain('x');
  }, 60_000);
});

describe('abx dashboard', () => {
  test('prints a one-time sign-in link that holds no key, for the local daemon and for a remote key', async () => {
    const printed = await cli.abx(['dashboard', '--no-open']);
    expect(printed.code).toBe(0);
    const key = readFileSync(join(home.home, 'api-key'), 'utf8').trim();
    const { apiUrl } = JSON.parse(readFileSync(join(home.home, 'daemon.json'), 'utf8'));
    const url = printed.stdout.trim().split('\n').at(-1) as string;
    expect(url.startsWith(`${apiUrl}/ui/signin?code=`)).toBe(true);
    expect(printed.stdout).not.toContain(key);
    expect(printed.stdout).toMatch(/once, within \d+ s/);
    // The link signs in once: the cookie it sets names a session of the daemon's key.
    const first = await fetch(url, { redirect: 'manual' });
    expect(first.status).toBe(303);
    const cookie = (first.headers.get('set-cookie') ?? '').split(';')[0] as string;
    const session = await fetch(`${apiUrl}/ui/session`, { headers: { cookie } });
    expect(await session.json()).toMatchObject({ admin: true });
    expect((await fetch(url, { redirect: 'manual' })).headers.get('location')).toBe(
      '/#/signin?error=link',
    );

    // A key that is not an admin gets a link for itself, over the remote API.
    const made = await cli.json<{ key: string }>(['keys', 'create', '--name', 'dash']);
    const linked = await as(made.key)(['dashboard', '--json']);
    expect(linked.code).toBe(0);
    const { url: theirs } = JSON.parse(linked.stdout) as { url: string };
    const opened = await fetch(theirs, { redirect: 'manual' });
    const theirCookie = (opened.headers.get('set-cookie') ?? '').split(';')[0] as string;
    const theirSession = await fetch(`${apiUrl}/ui/session`, { headers: { cookie: theirCookie } });
    expect(await theirSession.json()).toMatchObject({ admin: false, name: 'dash' });
    // A wrong key makes no link.
    const wrong = await as('abx_wrongwrongwrongwrongwrongwrongwrongwrongwro')(['dashboard']);
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain('AuthenticationError');
  });
});
