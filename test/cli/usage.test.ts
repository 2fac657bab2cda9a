import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { abxIn, CLI, inPty, sh } from './abx.js';

let home: Awaited<ReturnType<typeof createAbxHome>>;
let cli: ReturnType<typeof abxIn>;

beforeAll(async () => {
  home = await createAbxHome();
  cli = abxIn(home.home);
});

afterAll(async () => {
  await home?.close();
});

/** The subcommands a help text lists (without `help` itself). */
function subcommands(help: string): string[] {
  // The section ends at the first blank line; the examples follow it.
  const section = (help.split('\nCommands:\n')[1] ?? '').split('\n\n')[0] ?? '';
  return section
    .split('\n')
    .map((line) => /^ {2}([a-z-]+)/.exec(line)?.[1])
    .filter((name): name is string => name !== undefined && name !== 'help');
}

describe('abx help and usage errors', () => {
  test('every command has --help with an example', async () => {
    const seen: string[] = [];
    const visit = async (path: string[]) => {
      const { code, stdout } = await cli.abx([...path, '--help']);
      expect(code, path.join(' ')).toBe(0);
      expect(stdout, path.join(' ')).toMatch(/\nExamples?:\n {2}.*\babx /);
      seen.push(path.join(' '));
      // abx has two levels (abx server start); deeper would be a parsing mistake here.
      if (path.length < 2) {
        await Promise.all(subcommands(stdout).map((name) => visit([...path, name])));
      }
    };
    await visit([]);
    expect(seen).toEqual(
      expect.arrayContaining([
        'create',
        'list',
        'info',
        'kill',
        'timeout',
        'exec',
        'shell',
        'cp',
        'ls',
        'cat',
        'run',
        'commands',
        'server start',
        'server status',
        'server stop',
        'url',
        'template build',
        'template list',
        'template rm',
        'keys create',
        'keys list',
        'keys revoke',
        'daemon start',
        'daemon stop',
        'daemon status',
        'daemon logs',
      ]),
    );
  }, 120_000);

  test('unknown commands and flags exit 2 and suggest the closest', async () => {
    const command = await cli.abx(['craete']);
    expect(command).toEqual({
      code: 2,
      stdout: '',
      stderr: "error: unknown command 'craete'\n(Did you mean create?)\n",
    });
    const sub = await cli.abx(['server', 'stauts', 'x']);
    expect(sub.code).toBe(2);
    expect(sub.stderr).toContain('(Did you mean status?)');
    const flag = await cli.abx(['list', '--jsn']);
    expect(flag).toEqual({
      code: 2,
      stdout: '',
      stderr: "error: unknown option '--jsn'\n(Did you mean --json?)\n",
    });
    const missing = await cli.abx(['cat', 'x']);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toBe("error: missing required argument 'paths'\n");
  });
});

describe('abx in a pipeline', () => {
  /** Runs abx with its stdout's reader gone before it writes (`abx ... | head -0`). */
  const withClosedStdout = (args: readonly string[]) =>
    new Promise<{ code: number | null; stderr: string }>((resolve, reject) => {
      const child = spawn(process.execPath, [CLI, ...args], {
        env: { ...process.env, ...cli.env },
        stdio: ['ignore', 'pipe', 'pipe'],
        timeout: 120_000,
      });
      child.stdout.destroy();
      let stderr = '';
      child.stderr.setEncoding('utf8').on('data', (d: string) => {
        stderr += d;
      });
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, stderr }));
    });

  test('a closed stdout ends any command quietly, as SIGPIPE would (exit 141)', async () => {
    await cli.abx(['daemon', 'start']);
    for (const args of [['--help'], ['list'], ['daemon', 'status'], ['template', 'list']]) {
      const result = await withClosedStdout(args);
      expect(result, args.join(' ')).toEqual({ code: 141, stderr: '' });
    }
  });

  test("the program's help gives examples that work", async () => {
    const { stdout } = await cli.abx(['--help']);
    expect(stdout).toContain('abx list\n');
    // `abx ls` lists a sandbox's files and needs an id: never an example without one.
    expect(stdout).not.toMatch(/abx ls\s*$/m);
  });
});

describe('abx on a terminal', () => {
  const abxLine = (...args: string[]) => [process.execPath, CLI, ...args].map(sh).join(' ');

  test('template build: a line per step on a terminal; a failing step says which, its code, its output', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-build-steps-'));
    try {
      const good = join(dir, 'good.yaml');
      writeFileSync(good, 'name: steps\nsetup:\n  - echo one > one.txt\n  - echo two > two.txt\n');
      const built = await inPty(abxLine('template', 'build', good), {
        env: { ABX_HOME: home.home, NO_COLOR: '1' },
      });
      expect(built.code).toBe(0);
      expect(built.screen).toContain('[1/2] echo one > one.txt');
      expect(built.screen).toContain('[2/2] echo two > two.txt');
      expect(built.screen).toContain("built template 'steps' (2 setup steps");
      const bad = join(dir, 'bad.yaml');
      writeFileSync(
        bad,
        'name: steps\nsetup:\n  - echo fine\n  - echo "no such thing" >&2; exit 4\n',
      );
      const failed = await inPty(abxLine('template', 'build', bad), {
        env: { ABX_HOME: home.home, NO_COLOR: '1' },
      });
      expect(failed.code).toBe(1);
      expect(failed.screen).toContain('[2/2] echo "no such thing" >&2; exit 4');
      expect(failed.screen).toContain(
        'abx: TemplateBuildError: template \'steps\': setup[1] `echo "no such thing" >&2; exit 4` exited with code 4; its output ends:',
      );
      expect(failed.screen).toContain('no such thing');
      // In a pipe: no progress lines, the same error; with --progress, plain lines.
      const piped = await cli.abx(['template', 'build', bad]);
      expect(piped.stderr).not.toContain('[1/2]');
      expect(piped.stderr).toContain('exited with code 4');
      const logged = await cli.abx(['template', 'build', '--progress', good]);
      expect(logged.code).toBe(0);
      expect(logged.stderr).toBe('[1/2] echo one > one.txt\n[2/2] echo two > two.txt\n');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('spinners and colour on a terminal; plain text in a pipe', async () => {
    const created = await inPty(abxLine('create'), { env: { ABX_HOME: home.home, NO_COLOR: '' } });
    expect(created.code).toBe(0);
    expect(created.screen).toMatch(/⠋.* creating a sandbox from base/);
    expect(created.screen).toMatch(/created sandbox [a-z0-9]+ /);
    const error = await inPty(abxLine('info', 'nosuchbox'), {
      env: { ABX_HOME: home.home, NO_COLOR: '' },
    });
    expect(error.code).toBe(1);
    expect(error.screen).toContain(
      '\u001b[31mabx:\u001b[39m SandboxNotFoundError: sandbox nosuchbox',
    );

    const piped = await cli.abx(['create'], { env: { NO_COLOR: '' } });
    expect(piped.stderr).toBe('');
    expect(piped.stdout).toMatch(
      /^created sandbox [a-z0-9]+ \(template base, expires in \d+m\)\n$/,
    );
  });

  test('NO_COLOR turns colour off on a terminal too', async () => {
    const error = await inPty(abxLine('info', 'nosuchbox'), {
      env: { ABX_HOME: home.home, NO_COLOR: '1' },
    });
    expect(error.code).toBe(1);
    expect(error.screen).toContain('abx: SandboxNotFoundError: sandbox nosuchbox');
    expect(error.screen).not.toContain('\u001b[');
  });
});

describe('abx daemon', () => {
  test('status, logs and stop speak JSON and exit codes', async () => {
    // The suite's sandboxes started this home's daemon.
    const status = await cli.json<{ pid: number; apiUrl: string }>(['daemon', 'status']);
    expect(status.apiUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const started = await cli.json<{ pid: number }>(['daemon', 'start']);
    expect(started.pid).toBe(status.pid);
    const logs = await cli.abx(['daemon', 'logs', '-n', '5']);
    expect(logs.code).toBe(0);
    expect(logs.stdout.trim().split('\n').length).toBeLessThanOrEqual(5);

    expect(await cli.abx(['daemon', 'stop'])).toEqual({
      code: 0,
      stdout: 'daemon stopped\n',
      stderr: '',
    });
    const stopped = await cli.abx(['daemon', 'status', '--json']);
    expect(stopped).toEqual({ code: 1, stdout: 'null\n', stderr: '' });
  });
});
