import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, test } from 'vitest';
import { ensureBuilt, ROOT } from '../helpers/build.js';

function abx(...args: string[]) {
  const result = spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    env: { ...process.env, NO_COLOR: '1' },
    timeout: 60_000,
  });
  return { code: result.status, stdout: result.stdout, stderr: result.stderr };
}

const SAMPLE = ['--template', 'samples/template.yaml', '--module', 'samples/build/data-tools.js'];

beforeAll(() => {
  ensureBuilt();
}, 300_000);

describe('abx commands', () => {
  test('--json prints the discovery document of YAML and decorated commands', () => {
    const { code, stdout } = abx('commands', ...SAMPLE, '--json');
    expect(code).toBe(0);
    const { commands } = JSON.parse(stdout);
    expect(commands.map((c: { name: string }) => c.name)).toEqual([
      'count_lines',
      'head',
      'summarize',
      'add',
    ]);
    expect(commands[2].args).toEqual([
      { name: 'path', type: 'str', required: true, description: 'a CSV file with a header row' },
      { name: 'top', type: 'int', required: false, default: 10 },
      {
        name: 'column',
        type: 'str',
        required: false,
        default: 'name',
        description: 'the column to rank',
      },
    ]);
  });

  test('prints a table by default and JSON Schemas with --schema', () => {
    const table = abx('commands', ...SAMPLE);
    expect(table.code).toBe(0);
    const lines = table.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^NAME\s+SOURCE\s+ARGUMENTS\s+DESCRIPTION$/);
    expect(lines).toContainEqual(
      expect.stringMatching(/^head\s+yaml\s+path: str, lines: int = 5\s+Print/),
    );

    const schema = abx('list-commands', ...SAMPLE, '--schema');
    expect(schema.code).toBe(0);
    expect(JSON.parse(schema.stdout).add).toEqual({
      type: 'object',
      description: 'Add two numbers',
      properties: { x: { type: 'number' }, y: { type: 'integer', default: 2 } },
      required: ['x'],
      additionalProperties: false,
    });
  });

  test('a bad template exits 1 with the error class and its location', () => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-cli-'));
    try {
      writeFileSync(join(dir, 'template.yaml'), 'name: t\ncapabilities: [gpu]\n');
      const { code, stdout, stderr } = abx('commands', '--template', join(dir, 'template.yaml'));
      expect(code).toBe(1);
      expect(stdout).toBe('');
      expect(stderr).toBe(
        `abx: TemplateError: ${join(dir, 'template.yaml')}:2:16: capabilities[0]: must be one of shell, files, code, ports\n`,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('usage errors exit 2 and suggest the closest command', () => {
    const typo = abx('comands');
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain("unknown command 'comands'");
    expect(typo.stderr).toContain('(Did you mean commands?)');

    const missing = abx('commands');
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('abx: UsageError: give a sandbox id or --template');
  });

  test('--help shows an example', () => {
    const { code, stdout } = abx('commands', '--help');
    expect(code).toBe(0);
    expect(stdout).toContain('abx commands --template samples/template.yaml');
  });
});

describe('the README demo', () => {
  test('prints the merged command list of samples/ as a table and as JSON', () => {
    const result = spawnSync(
      process.execPath,
      [join(ROOT, 'samples', 'build', 'list-commands.js')],
      {
        cwd: ROOT,
        encoding: 'utf8',
      },
    );
    expect(result.status).toBe(0);
    const [table, json] = result.stdout.split('\nDiscovery document:\n');
    expect(table).toMatch(/summarize\s+decorator\s+path: str, top: int = 10, column: str = "name"/);
    expect(table).toMatch(/count_lines\s+yaml\s+path: str/);
    expect(JSON.parse(json ?? '').commands).toHaveLength(4);
  });
});
