import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { abxIn, CLI, inPty, sh } from './abx.js';

let home: Awaited<ReturnType<typeof createAbxHome>>;
let cli: ReturnType<typeof abxIn>;
let id: string;

beforeAll(async () => {
  home = await createAbxHome();
  cli = abxIn(home.home);
  id = (await cli.abx(['create', '-q'])).stdout.trim();
});

afterAll(async () => {
  await home?.close();
});

describe('abx exec', () => {
  test("passes stdout and stderr through apart and exits with the command's code", async () => {
    const result = await cli.abx(['exec', id, '--', 'sh', '-c', 'echo out; echo err >&2; exit 3']);
    expect(result).toEqual({ code: 3, stdout: 'out\n', stderr: 'err\n' });
    expect((await cli.abx(['exec', id, '--', 'true'])).code).toBe(0);
  });

  test('one word is a shell line; several are an argv, quoted for the shell', async () => {
    const line = await cli.abx(['exec', id, '--', 'printf "%s\\n" a b | wc -l']);
    expect(line.stdout.trim()).toBe('2');
    const argv = await cli.abx([
      'exec',
      id,
      '--',
      'printf',
      '[%s]',
      'two words',
      "it's",
      '$HOME',
      ';',
    ]);
    expect(argv.stdout).toBe("[two words][it's][$HOME][;]");
  });

  test('--cwd, --env and -i (stdin) reach the command', async () => {
    const where = await cli.abx([
      'exec',
      id,
      '--cwd',
      '/tmp',
      '-e',
      'A=1',
      '-e',
      'B=x y',
      '--',
      'echo "$PWD $A $B"',
    ]);
    expect(where.stdout).toBe('/tmp 1 x y\n');
    const piped = await cli.abx(['exec', '-i', id, '--', 'tr a-z A-Z'], {
      input: 'hello\nworld\n',
    });
    expect(piped).toEqual({ code: 0, stdout: 'HELLO\nWORLD\n', stderr: '' });
  });

  test("--timeout kills the command and exits 124, saying so in the CLI's words", async () => {
    const result = await cli.abx(['exec', id, '--timeout', '1s', '--', 'echo started; sleep 30']);
    expect(result.code).toBe(124);
    expect(result.stdout).toBe('started\n');
    expect(result.stderr).toBe(
      'abx: the command ran past --timeout 1s and was stopped (its process group was killed); give it longer with --timeout, e.g. --timeout 10m\n',
    );
  });

  test('an ended sandbox is an error (exit 1), a missing command word a usage error (exit 2)', async () => {
    const gone = await cli.abx(['exec', 'nosuchbox', '--', 'true']);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toContain('abx: SandboxNotFoundError: sandbox nosuchbox does not exist');
    const missing = await cli.abx(['exec', id]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("missing required argument 'command'");
  });
});

describe('abx shell', () => {
  test('opens a real pty in the sandbox, at the size of the local terminal', async () => {
    let typed = false;
    const { code, screen } = await inPty(`${sh(process.execPath)} ${sh(CLI)} shell ${id}`, {
      env: { ABX_HOME: home.home },
      // Type once the sandbox's prompt is on the screen.
      respond: (text) => {
        if (typed || !/user@\S+:~\$ /.test(text)) return undefined;
        typed = true;
        return 'echo hi-$((6*7)); tty; tput cols; exit\n';
      },
    });
    expect(code).toBe(0);
    // What a terminal would show on each line: the text after the last carriage return.
    const lines = screen.split(/\r*\n/).map((line) => line.slice(line.lastIndexOf('\r') + 1));
    expect(lines).toContain('hi-42');
    expect(lines).toContainEqual(expect.stringMatching(/^\/dev\/pts\/\d+$/));
    expect(lines).toContain('91');
  });

  test("abx shell exits with the shell's code; non-ASCII text arrives whole", async () => {
    // Many multi-byte characters, so some fall across the boundaries of envd's output reads.
    const line = 'héllo wörld ✓ 日本語';
    const result = await cli.abx(['shell', id], {
      input: `for i in $(seq 300); do printf '%s\\n' '${line}'; done; exit 7\n`,
    });
    expect(result.code).toBe(7);
    const whole = result.stdout
      .split(/\r?\n/)
      .filter((l) => l.endsWith(line) && !l.includes('printf'));
    expect(whole).toHaveLength(300);
    expect(result.stdout).not.toContain('\uFFFD');
  });

  test('piped input that ends closes the session', async () => {
    const result = await cli.abx(['shell', id], { input: 'echo piped-$((1+1))\n' });
    expect(result.code).toBe(0);
    expect(result.stdout).toContain('piped-2');
  });
});
