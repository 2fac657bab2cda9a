import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { abxIn } from './abx.js';

interface Info {
  sandboxId: string;
  template: string;
  state: string;
  metadata: Record<string, string>;
  createdAt: string;
  expiresAt: string;
}

let home: Awaited<ReturnType<typeof createAbxHome>>;
let cli: ReturnType<typeof abxIn>;

beforeAll(async () => {
  home = await createAbxHome();
  cli = abxIn(home.home);
});

afterAll(async () => {
  await home?.close();
});

describe('abx create, list, info, timeout, kill', () => {
  test('create -q prints the id alone; list, info and kill find it', async () => {
    const created = await cli.abx([
      'create',
      '-q',
      '--meta',
      'suite=lifecycle',
      '--timeout',
      '10m',
    ]);
    expect(created.code).toBe(0);
    const id = created.stdout.trim();
    expect(created.stdout).toBe(`${id}\n`);
    expect(id).toMatch(/^[a-z0-9]+$/);

    const listed = await cli.json<Info[]>(['list', '--meta', 'suite=lifecycle']);
    expect(listed.map((s) => [s.sandboxId, s.template, s.state, s.metadata])).toEqual([
      [id, 'base', 'running', { suite: 'lifecycle' }],
    ]);
    // --timeout 10m: the sandbox lives 10 minutes from its creation.
    const [info] = listed;
    expect(Date.parse(info?.expiresAt ?? '') - Date.parse(info?.createdAt ?? '')).toBe(600_000);

    const table = await cli.abx(['list']);
    expect(table.code).toBe(0);
    const lines = table.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^ID\s+TEMPLATE\s+STATE\s+AGE\s+EXPIRES$/);
    expect(lines).toContainEqual(expect.stringMatching(new RegExp(`^${id}\\s+base\\s+running\\s`)));

    const human = await cli.abx(['info', id]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(new RegExp(`^id:\\s+${id}$`, 'm'));
    expect(human.stdout).toMatch(/^metadata:\s+suite=lifecycle$/m);

    const killed = await cli.json<{ sandboxId: string; killed: boolean }[]>(['kill', id]);
    expect(killed).toEqual([{ sandboxId: id, killed: true }]);
    // info still describes an ended sandbox; a second kill reports it as already ended.
    expect((await cli.json<Info>(['info', id])).state).toBe('killed');
    const again = await cli.abx(['kill', id]);
    expect(again).toEqual({ code: 0, stdout: `${id} had already ended\n`, stderr: '' });
    expect(await cli.json<Info[]>(['list', '--meta', 'suite=lifecycle'])).toEqual([]);
    const all = await cli.json<Info[]>(['list', '--all', '--meta', 'suite=lifecycle']);
    expect(all.map((s) => [s.sandboxId, s.state])).toEqual([[id, 'killed']]);
    const ended = await cli.json<Info[]>([
      'list',
      '--state',
      'killed,expired',
      '--meta',
      'suite=lifecycle',
    ]);
    expect(ended.map((s) => s.sandboxId)).toEqual([id]);
    // A dozen abx processes in a row: more than the default 30 s on a loaded machine.
  }, 120_000);

  test('create --json with --env and a template; the env reaches commands', async () => {
    const info = await cli.json<Info>(['create', '--template', 'base', '--env', 'GREETING=a=b c']);
    expect(info.template).toBe('base');
    const echoed = await cli.abx(['exec', info.sandboxId, '--', 'printf %s "$GREETING"']);
    expect(echoed).toEqual({ code: 0, stdout: 'a=b c', stderr: '' });

    const human = await cli.abx(['create']);
    expect(human.stdout).toMatch(
      /^created sandbox [a-z0-9]+ \(template base, expires in \d+m\)\n$/,
    );
  });

  test('timeout sets the time left, in the units people write', async () => {
    const id = (await cli.abx(['create', '-q'])).stdout.trim();
    const before = await cli.json<Info>(['info', id]);
    const after = await cli.json<Info>(['timeout', id, '1h']);
    // From "now" (after creation), one hour: later than creation + 1 h, unlike the default 5 min.
    expect(Date.parse(after.expiresAt)).toBeGreaterThanOrEqual(
      Date.parse(before.createdAt) + 3_600_000,
    );
    const human = await cli.abx(['timeout', id, '90s']);
    expect(human.stdout).toMatch(new RegExp(`^sandbox ${id} now expires in \\d+[ms] \\(`));
  });

  test('kill --all kills every running sandbox', async () => {
    const ids = [
      (await cli.abx(['create', '-q'])).stdout.trim(),
      (await cli.abx(['create', '-q'])).stdout.trim(),
    ];
    const result = await cli.json<{ sandboxId: string; killed: boolean }[]>(['kill', '--all']);
    expect(result.map((r) => r.sandboxId)).toEqual(expect.arrayContaining(ids));
    expect(result.every((r) => r.killed)).toBe(true);
    expect(await cli.json<Info[]>(['list'])).toEqual([]);
  });

  test('errors: unknown ids exit 1 with a hint; bad usage exits 2', async () => {
    const unknown = await cli.abx(['info', 'nosuchbox']);
    expect(unknown).toEqual({
      code: 1,
      stdout: '',
      stderr:
        'abx: SandboxNotFoundError: sandbox nosuchbox does not exist\nhint: `abx list --all` shows your sandboxes and how they ended\n',
    });
    const template = await cli.abx(['create', '--template', 'no-such-template']);
    expect(template.code).toBe(1);
    expect(template.stderr).toMatch(
      /^abx: TemplateNotFoundError: template 'no-such-template' is not built/,
    );

    const nothing = await cli.abx(['kill']);
    expect(nothing.code).toBe(2);
    expect(nothing.stderr).toBe(
      'abx: UsageError: give the ids of the sandboxes to kill, or --all\nhint: see `abx kill --help`\n',
    );
    const duration = await cli.abx(['timeout', 'nosuchbox', '10 minutes']);
    expect(duration.code).toBe(2);
    expect(duration.stderr).toContain('expected a duration such as 30s, 10m or 1h');
    // Past the longest lifetime: a usage error in the CLI's terms, before anything is sent.
    const tooLong = await cli.abx(['create', '--timeout', '25h']);
    expect(tooLong.code).toBe(2);
    expect(tooLong.stderr).toBe(
      "error: option '--timeout <duration>' argument '25h' is invalid. a sandbox lives at most 24h (and at least 1ms): give a duration such as 30m or 24h, not 25h.\n",
    );
    expect((await cli.abx(['timeout', 'nosuchbox', '2d'])).code).toBe(2);
    const badState = await cli.abx(['list', '--state', 'running,asleep']);
    expect(badState.code).toBe(2);
    expect(badState.stderr).toContain(
      "expected one or more of running, paused, pooled, killed, expired, dead, not 'asleep'",
    );
    const createDuration = await cli.abx(['create', '--timeout', '5x']);
    expect(createDuration.code).toBe(2);
    expect(createDuration.stderr).toContain(
      "option '--timeout <duration>' argument '5x' is invalid",
    );
  });

  test('values the daemon refuses as wrong input exit 2, like the CLI’s own usage errors', async () => {
    const before = await cli.json<Info[]>(['list', '--all']);
    const volume = await cli.abx(['create', '-q', '--volume', 'data:/etc/x']);
    expect(volume).toEqual({
      code: 2,
      stdout: '',
      stderr:
        "abx: InvalidArgumentError: volumeMounts[0].path /etc/x is not a place a volume can go: mount it in a folder inside /home/user, /tmp, /mnt (for example /mnt/data); the system's folders are read-only and /home/user, /tmp, /mnt themselves are the sandbox's own\n",
    });
    const network = await cli.abx(['create', '-q', '--allow', 'not a cidr!!']);
    expect(network).toEqual({
      code: 2,
      stdout: '',
      stderr:
        "abx: InvalidArgumentError: network.allowOut[0]: 'not a cidr!!' is neither a CIDR, an IP address, a domain name nor a *.domain wildcard\n",
    });
    // Nothing was made by either.
    expect(await cli.json<Info[]>(['list', '--all'])).toEqual(before);
    // A state of things, not the command line: still 1.
    expect((await cli.abx(['info', 'nosuchbox'])).code).toBe(1);
    const help = await cli.abx(['--help']);
    expect(help.stdout).toContain('Exit codes:\n  0    done\n  1    an error');
    expect(help.stdout).toContain(
      '  2    usage: a wrong command line, or a value the control plane refused',
    );
  });

  test('resume --timeout applies when the sandbox was resumed already (by its traffic)', async () => {
    const id = (
      await cli.abx(['create', '-q', '--timeout', '2s', '--auto-pause', '--auto-resume'])
    ).stdout.trim();
    try {
      expect(id).toMatch(/^\w+$/);
      let state = '';
      for (let i = 0; i < 100 && state !== 'paused'; i++) {
        await new Promise((resolve) => setTimeout(resolve, 200));
        state = (await cli.json<Info>(['info', id])).state;
      }
      expect(state).toBe('paused');
      // A request resumes it, with the template's lifetime (5 minutes).
      const ran = await cli.abx(['exec', id, 'true']);
      expect(ran.code, ran.stderr).toBe(0);
      const resumed = await cli.json<Info>(['info', id]);
      expect(resumed.state).toBe('running');
      expect(Date.parse(resumed.expiresAt) - Date.now()).toBeLessThan(6 * 60_000);

      const asked = await cli.abx(['resume', id, '--timeout', '20m']);
      expect(asked.code, asked.stderr).toBe(0);
      expect(asked.stdout).toMatch(
        new RegExp(`^${id} was running already; it expires in (19|20)m \\(--timeout applied\\)\n$`),
      );
      const left = Date.parse((await cli.json<Info>(['info', id])).expiresAt) - Date.now();
      expect(left).toBeGreaterThan(19 * 60_000);
      expect(left).toBeLessThanOrEqual(20 * 60_000);
      const json = await cli.json<Info & { resumed: boolean }>(['resume', id, '--timeout', '30m']);
      expect(json.resumed).toBe(false);
      expect(Date.parse(json.expiresAt) - Date.now()).toBeGreaterThan(29 * 60_000);
      // Without --timeout a running sandbox's lifetime is left as it is.
      await cli.abx(['resume', id]);
      expect(
        Date.parse((await cli.json<Info>(['info', id])).expiresAt) - Date.now(),
      ).toBeGreaterThan(29 * 60_000);
    } finally {
      if (id) await cli.abx(['kill', id]);
    }
  }, 60_000);
});
