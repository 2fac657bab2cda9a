import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { abxIn } from './abx.js';

interface Description {
  name: string;
  args: { name: string; type: string; required: boolean; default?: unknown }[];
}

let home: Awaited<ReturnType<typeof createAbxHome>>;
let cli: ReturnType<typeof abxIn>;
let dir: string;
let id: string;

// A template of its own: `mark` leaves a trace, so a refused call can be shown to have done nothing.
const TEMPLATE = `name: cli-tools
capabilities: [shell, files, code, ports]
custom_commands:
  mark:
    description: Append a number to marks.txt
    command: echo {n} >> marks.txt && cat marks.txt
    args:
      - { name: n, type: int }
  fail:
    description: Exit with a code
    command: echo failing >&2; exit {code}
    args:
      - { name: code, type: int, default: 7 }
`;

beforeAll(async () => {
  home = await createAbxHome();
  cli = abxIn(home.home);
  dir = mkdtempSync(join(tmpdir(), 'abx-cli-commands-'));
  writeFileSync(join(dir, 'template.yaml'), TEMPLATE);
});

afterAll(async () => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  await home?.close();
});

describe('abx template, commands, run, server', () => {
  test('template build and list (JSON and table)', async () => {
    const built = await cli.json<{ name: string; capabilities: string[] }>([
      'template',
      'build',
      join(dir, 'template.yaml'),
    ]);
    expect(built).toMatchObject({
      name: 'cli-tools',
      capabilities: ['shell', 'files', 'code', 'ports'],
    });
    const listed = await cli.json<{ name: string }[]>(['template', 'list']);
    expect(listed.map((t) => t.name).sort()).toEqual(['base', 'cli-tools']);
    const table = await cli.abx(['template', 'list']);
    // An admin key built it: it is in the shared catalogue.
    expect(table.stdout).toMatch(
      /^cli-tools\s+yes\s+shell,files,code,ports\s+internet\s+5m\s+\d{4}-/m,
    );

    id = (await cli.abx(['create', '-q', '--template', 'cli-tools'])).stdout.trim();
  });

  test('commands ID lists the YAML commands: table, discovery document, JSON Schemas', async () => {
    const { commands } = await cli.json<{ commands: Description[] }>(['commands', id]);
    expect(commands.map((c) => c.name)).toEqual(['mark', 'fail']);
    expect(commands[1]?.args).toEqual([{ name: 'code', type: 'int', required: false, default: 7 }]);

    const schemas = JSON.parse((await cli.abx(['list-commands', id, '--schema'])).stdout);
    expect(schemas.mark).toEqual({
      type: 'object',
      description: 'Append a number to marks.txt',
      properties: { n: { type: 'integer' } },
      required: ['n'],
      additionalProperties: false,
    });
    const table = await cli.abx(['commands', id]);
    expect(table.stdout).toMatch(/^fail\s+yaml\s+code: int = 7\s+Exit with a code$/m);
  });

  test("run: a YAML command's output and exit code pass through", async () => {
    const first = await cli.abx(['run', id, 'mark', '-a', 'n=1']);
    expect(first).toEqual({ code: 0, stdout: '1\n', stderr: '' });
    const failing = await cli.abx(['run', id, 'fail', '-a', 'code=5']);
    expect(failing).toEqual({ code: 5, stdout: '', stderr: 'failing\n' });
    const json = await cli.abx(['run', id, 'fail', '--json']);
    expect(json.code).toBe(7);
    expect(JSON.parse(json.stdout)).toEqual({ stdout: '', stderr: 'failing\n', exitCode: 7 });
  });

  test('run refuses bad arguments with the usage (exit 2) and runs nothing', async () => {
    const bad = await cli.abx(['run', id, 'mark', '-a', 'n=1.5', '-a', 'm=2']);
    expect(bad.code).toBe(2);
    expect(bad.stdout).toBe('');
    expect(bad.stderr).toBe(
      "abx: ArgumentError: invalid arguments for 'mark': n: \"1.5\" is not a whole number such as 42; unknown argument 'm' (did you mean 'n'?). Usage: mark -a n=<int>\n" +
        'hint: usage: abx run ID mark -a n=<int>\n',
    );
    // marks.txt holds only the mark of the earlier, valid call.
    expect((await cli.abx(['cat', id, 'marks.txt'])).stdout).toBe('1\n');

    const unknown = await cli.abx(['run', id, 'mrak']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toBe(
      "abx: CommandNotFoundError: no command 'mrak' in this sandbox; available: mark, fail\n" +
        'hint: `abx commands ID` lists the commands of a sandbox\n',
    );
  });

  test('server start/status/stop; run calls a decorated command on it', async () => {
    const stopped = await cli.abx(['server', 'status', id, '--json']);
    expect(stopped.code).toBe(1);
    expect(JSON.parse(stopped.stdout)).toEqual({ running: false });

    const started = await cli.json<{ running: boolean; url: string; commands: Description[] }>([
      'server',
      'start',
      id,
      '--module',
      'samples/build/data-tools.js',
      '--port',
      '8080',
    ]);
    expect(started.running).toBe(true);
    expect(started.url).toMatch(
      new RegExp(`^http://127\\.0\\.0\\.1:\\d+/sandboxes/${id}/ports/8080$`),
    );
    expect(started.commands.map((c) => c.name)).toEqual(['summarize', 'add']);

    const status = await cli.abx(['server', 'status', id]);
    expect(status.code).toBe(0);
    expect(status.stdout).toMatch(/^running at http:\S+; commands: summarize, add\n$/);

    const { commands } = await cli.json<{ commands: Description[] }>(['commands', id]);
    expect(commands.map((c) => c.name)).toEqual(['mark', 'fail', 'summarize', 'add']);

    expect(await cli.abx(['run', id, 'add', '-a', 'x=40'])).toEqual({
      code: 0,
      stdout: '42\n',
      stderr: '',
    });
    expect(await cli.json(['run', id, 'add', '-a', 'x=0.5', '-a', 'y=1'])).toBe(1.5);
    const bad = await cli.abx(['run', id, 'add', '-a', 'y=1.5']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('missing required argument: x');

    // A second server on another port is addressed with --port.
    const other = await cli.abx([
      'server',
      'start',
      id,
      '-m',
      'samples/build/data-tools.js',
      '--port',
      '8081',
    ]);
    expect(other.code).toBe(0);
    expect((await cli.abx(['server', 'status', id, '--port', '8081'])).stdout).toMatch(
      new RegExp(`^running at http://127\\.0\\.0\\.1:\\d+/sandboxes/${id}/ports/8081\\b`),
    );
    expect(await cli.abx(['server', 'stop', id, '--port', '8081'])).toEqual({
      code: 0,
      stdout: `command server of ${id} on port 8081 stopped\n`,
      stderr: '',
    });
    expect((await cli.abx(['server', 'status', id])).code).toBe(0);

    expect(await cli.abx(['server', 'stop', id])).toEqual({
      code: 0,
      stdout: `command server of ${id} on port 8080 stopped\n`,
      stderr: '',
    });
    const none = await cli.abx(['server', 'status', id]);
    expect([none.code, none.stdout]).toEqual([
      1,
      `no command server runs in sandbox ${id} on port 8080\n`,
    ]);
  });

  test('server start in a sandbox without the ports capability: exit 1 with a hint', async () => {
    const plain = (await cli.abx(['create', '-q'])).stdout.trim();
    const result = await cli.abx(['server', 'start', plain, '-m', 'samples/build/data-tools.js']);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^abx: CapabilityError: .*lacks the ports capability/);
    expect(result.stderr).toContain("hint: add it to the template's `capabilities`");
  });

  test('commands needs a sandbox or --template (exit 2); template rm removes', async () => {
    const neither = await cli.abx(['commands']);
    expect(neither).toEqual({
      code: 2,
      stdout: '',
      stderr: 'abx: UsageError: give a sandbox id or --template\nhint: see `abx commands --help`\n',
    });
    expect(await cli.abx(['template', 'rm', 'cli-tools'])).toEqual({
      code: 0,
      stdout: "removed template 'cli-tools'\n",
      stderr: '',
    });
    const listed = await cli.json<{ name: string }[]>(['template', 'list']);
    expect(listed.map((t) => t.name)).toEqual(['base']);
  });
});
