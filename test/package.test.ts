import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ensureBuilt, ROOT } from './helpers/build.js';

// A separate project that installs this checkout with `npm install <path>` and compiles a
// decorated class with its own tsc, as a user would.
let project: string;

const TOOLS = `import { arg, int, sandbox } from 'agent-sandbox';

@sandbox('user-tools')
export class UserTools {
  @sandbox.register({ description: 'Greet someone' })
  greet(name: string, @int times: number = 1, @arg({ description: 'shout it' }) loud = false): string {
    const text = \`hello \${name}\`.repeat(times);
    return loud ? text.toUpperCase() : text;
  }
}
`;

// No `import 'reflect-metadata'` anywhere: the package loads its polyfill itself.
const MAIN = `import { commandManifest, listCommands, loadTemplate, parseCommandArgs, toJSONSchema } from 'agent-sandbox';
import './tools.js';

const template = loadTemplate('template.yaml');
const commands = listCommands(template.name);
const greet = commands.find((c) => c.name === 'greet')!;
const kwargs = parseCommandArgs(greet, ['name=ada', 'times=2']);
const invoked = await commandManifest('user-tools').commands[0]!.invoke(kwargs);
console.log(JSON.stringify({ commands, kwargs, schema: toJSONSchema(greet), invoked }));
`;

const CJS = `import sdk = require('agent-sandbox');

console.log(JSON.stringify(sdk.parseTemplate('name: cjs-ok').name));
`;

const TEMPLATE = `name: user-tools
custom_commands:
  shout:
    command: echo {text} | tr a-z A-Z
    args: [{ name: text, type: str }]
`;

const TSCONFIG = {
  compilerOptions: {
    target: 'ES2022',
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    strict: true,
    experimentalDecorators: true,
    emitDecoratorMetadata: true,
    skipLibCheck: false,
    types: ['node'],
    outDir: 'build',
    rootDir: 'src',
  },
  include: ['src'],
};

function run(command: string, args: string[]): string {
  return execFileSync(command, args, { cwd: project, encoding: 'utf8', timeout: 180_000 });
}

beforeAll(() => {
  ensureBuilt();
  project = mkdtempSync(join(tmpdir(), 'abx-user-project-'));
  writeFileSync(
    join(project, 'package.json'),
    JSON.stringify({ name: 'user-project', private: true, type: 'module' }),
  );
  run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', ROOT, '@types/node@20']);
  mkdirSync(join(project, 'src'));
  writeFileSync(join(project, 'src', 'tools.ts'), TOOLS);
  writeFileSync(join(project, 'src', 'main.ts'), MAIN);
  writeFileSync(join(project, 'src', 'cjs.cts'), CJS);
  writeFileSync(join(project, 'template.yaml'), TEMPLATE);
  writeFileSync(join(project, 'tsconfig.json'), JSON.stringify(TSCONFIG));
}, 300_000);

afterAll(() => {
  if (project) rmSync(project, { recursive: true, force: true });
});

describe('installed as a dependency of another project', () => {
  test("the project's own tsc compiles decorated classes against the package types", () => {
    const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
    const result = spawnSync(process.execPath, [tsc, '-p', project], { encoding: 'utf8' });
    expect(result.stdout + result.stderr).toBe('');
    expect(result.status).toBe(0);

    const output = JSON.parse(run(process.execPath, ['build/main.js']));
    expect(output.commands).toEqual([
      {
        name: 'shout',
        description: '',
        template: 'user-tools',
        source: 'yaml',
        command: 'echo {text} | tr a-z A-Z',
        args: [{ name: 'text', type: 'str', required: true }],
      },
      {
        name: 'greet',
        description: 'Greet someone',
        template: 'user-tools',
        source: 'decorator',
        args: [
          { name: 'name', type: 'str', required: true },
          { name: 'times', type: 'int', required: false, default: 1 },
          { name: 'loud', type: 'bool', required: false, default: false, description: 'shout it' },
        ],
      },
    ]);
    expect(output.kwargs).toEqual({ name: 'ada', times: 2, loud: false });
    expect(output.schema.properties.times).toEqual({ type: 'integer', default: 1 });
    expect(output.invoked).toBe('hello adahello ada');

    // The CommonJS build answers require() too.
    expect(run(process.execPath, ['build/cjs.cjs']).trim()).toBe('"cjs-ok"');
  });

  test('importing the package needs no reflect-metadata import of its own', () => {
    const result = spawnSync(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        "const sdk = await import('agent-sandbox'); console.log(typeof Reflect.getMetadata, typeof sdk.Sandbox)",
      ],
      { cwd: project, encoding: 'utf8' },
    );
    expect(result.stderr).toBe('');
    expect(result.stdout.trim()).toBe('function function');
  });
});
