import { execFileSync, spawnSync } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from './helpers/abx-home.js';
import { ensureBuilt, ROOT } from './helpers/build.js';
import { readmeBlock } from './helpers/readme.js';

// A separate project that installs the package as a user would, from the tarball `npm pack`
// makes (no link to this checkout, nothing compiled at install), and compiles a decorated class
// and the README's first example with its own tsc; the example runs against a real daemon, the
// one the installed package starts.
let project: string;
let packs: string;

const TOOLS = `import { arg, int, sandbox } from 'abx-sandbox';

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
const MAIN = `import { commandManifest, listCommands, loadTemplate, parseCommandArgs, toJSONSchema } from 'abx-sandbox';
import './tools.js';

const template = loadTemplate('template.yaml');
const commands = listCommands(template.name);
const greet = commands.find((c) => c.name === 'greet')!;
const kwargs = parseCommandArgs(greet, ['name=ada', 'times=2']);
const invoked = await commandManifest('user-tools').commands[0]!.invoke(kwargs);
console.log(JSON.stringify({ commands, kwargs, schema: toJSONSchema(greet), invoked }));
`;

const CJS = `import sdk = require('abx-sandbox');

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
  packs = mkdtempSync(join(tmpdir(), 'abx-pack-'));
  execFileSync('npm', ['pack', '--silent', '--pack-destination', packs], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 180_000,
  });
  const [tarball] = readdirSync(packs).filter((name) => name.endsWith('.tgz'));
  if (tarball === undefined) throw new Error(`npm pack wrote no tarball in ${packs}`);
  project = mkdtempSync(join(tmpdir(), 'abx-user-project-'));
  writeFileSync(
    join(project, 'package.json'),
    JSON.stringify({ name: 'user-project', private: true, type: 'module' }),
  );
  // --foreground-scripts: an install script that compiled something would show in its output.
  const installed = run('npm', [
    'install',
    '--prefer-offline',
    '--no-audit',
    '--no-fund',
    '--foreground-scripts',
    join(packs, tarball),
    '@types/node@22',
    'typescript@5.9.3',
  ]);
  installLog = installed;
  mkdirSync(join(project, 'src'));
  writeFileSync(join(project, 'src', 'tools.ts'), TOOLS);
  writeFileSync(join(project, 'src', 'main.ts'), MAIN);
  writeFileSync(join(project, 'src', 'cjs.cts'), CJS);
  writeFileSync(join(project, 'template.yaml'), TEMPLATE);
  writeFileSync(join(project, 'tsconfig.json'), JSON.stringify(TSCONFIG));
}, 300_000);

afterAll(() => {
  if (project) rmSync(project, { recursive: true, force: true });
  if (packs) rmSync(packs, { recursive: true, force: true });
});

let installLog = '';

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
        "const sdk = await import('abx-sandbox'); console.log(typeof Reflect.getMetadata, typeof sdk.Sandbox)",
      ],
      { cwd: project, encoding: 'utf8' },
    );
    expect(result.stderr).toBe('');
    expect(result.stdout.trim()).toBe('function function');
  });

  test('the package is installed from its tarball, a copy, and nothing compiled at install', () => {
    const at = join(project, 'node_modules', 'abx-sandbox');
    expect(lstatSync(at).isSymbolicLink()).toBe(false);
    expect(existsSync(join(at, 'dist', 'cli.js'))).toBe(true);
    expect(installLog).not.toMatch(/node-gyp|gyp info|prebuild-install/);
    // Prebuilt Node-API binaries (koffi's, esbuild's) come in packages; none is built here.
    const natives = spawnSync('find', ['node_modules', '-path', '*/build/Release/*.node'], {
      cwd: project,
      encoding: 'utf8',
    });
    expect(natives.stdout.trim()).toBe('');
  });
});

describe("the README's first example in a project of its own", () => {
  test('installed from the tarball, compiled with its tsc, it runs against the daemon it starts', async () => {
    const abx = await createAbxHome();
    const dir = mkdtempSync(join(tmpdir(), 'abx-readme-project-'));
    try {
      const tsconfig = JSON.parse(
        readmeBlock('json', 'Use it in your project', 'compilerOptions').code,
      );
      writeFileSync(join(dir, 'package.json'), JSON.stringify({ private: true, type: 'module' }));
      writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify(tsconfig));
      writeFileSync(
        join(dir, 'template.yaml'),
        readmeBlock('yaml', 'Use it in your project', 'name: data-tools').code,
      );
      writeFileSync(join(dir, 'main.ts'), readmeBlock('ts', 'Use it in your project').code);
      // The packages the first project installed, as the README's `npm install` lines give them.
      execFileSync('cp', ['-a', join(project, 'node_modules'), join(dir, 'node_modules')]);
      const tsc = spawnSync(
        process.execPath,
        [join(dir, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir],
        { encoding: 'utf8', timeout: 180_000 },
      );
      expect(tsc.stdout + tsc.stderr).toBe('');
      const ran = spawnSync(process.execPath, ['main.js'], {
        cwd: dir,
        encoding: 'utf8',
        env: { ...process.env, ABX_HOME: abx.home },
        timeout: 240_000,
      });
      expect(ran.stderr).toBe('');
      expect(ran.status).toBe(0);
      expect(ran.stdout.startsWith('42\n'), ran.stdout).toBe(true);
      expect(ran.stdout).toMatch(/stdout: 'Linux /);
      // The daemon that answered is the installed package's own, not this checkout's.
      const { pid } = JSON.parse(readFileSync(join(abx.home, 'daemon.json'), 'utf8'));
      const daemon = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      expect(daemon[1]).toBe(join(dir, 'node_modules', 'abx-sandbox', 'dist', 'daemon.js'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
      await abx.close();
    }
  }, 300_000);
});
