import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { DaemonUnavailableError } from '../../src/errors.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { readmeBlock } from '../helpers/readme.js';
import { userProject } from '../helpers/user-project.js';

// The README's first example, pasted into one file of a user's project, compiled with the
// project's tsc and the README's tsconfig lines, and run with node against a private daemon.

/** The README's tsconfig lines, from README.md itself. */
const TSCONFIG = JSON.parse(
  readmeBlock('json', 'Use it in your project', 'compilerOptions').code,
) as {
  compilerOptions: Record<string, unknown>;
};

const TEMPLATE = 'name: data-tools\ncapabilities: [shell, files, code, ports]\n';

/** The README's snippet, as a user pastes it (plus a line that must not run in the sandbox). */
const README = `import { Sandbox, Templates, int, sandbox } from 'abx-sandbox';
import { writeFileSync } from 'node:fs';

@sandbox('data-tools')
export class DataTools {
  @sandbox.register({ description: 'Add two numbers' })
  add(x: number, @int y: number = 2) {
    return x + y;
  }
}

writeFileSync('side-effect.txt', 'the script ran here'); // the script's own top-level code
await Templates.build('template.yaml'); // name: data-tools, capabilities: [..., ports]
await using box = await Sandbox.create({ template: 'data-tools' });
await box.server.start({ commands: [DataTools] }); // bundle, upload, start, wait for /health
console.log(await box.server.call('add', { x: 40 })); // 42, one HTTP round trip
console.log(await box.commands.run('uname -a')); // { stdout, stderr, exitCode }
console.log('ran in the sandbox:', await box.files.exists('side-effect.txt'));
console.log('sandbox', box.sandboxId);
`;

/** The same wrapped in main(), with an explicit kill. */
const MAIN = `import { Sandbox, Templates, int, sandbox } from 'abx-sandbox';
import { writeFileSync } from 'node:fs';

@sandbox('data-tools')
export class DataTools {
  @sandbox.register({ description: 'Add two numbers' })
  add(x: number, @int y: number = 2) {
    return x + y;
  }
}

async function main() {
  writeFileSync('side-effect.txt', 'the script ran here');
  await Templates.build('template.yaml');
  const box = await Sandbox.create({ template: 'data-tools' });
  try {
    await box.server.start({ commands: [DataTools] });
    console.log(await box.server.call('add', { x: 40 }));
    console.log('ran in the sandbox:', await box.files.exists('side-effect.txt'));
    console.log('sandbox', box.sandboxId);
  } finally {
    await box.kill();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
`;

/** A class that needs a value the script computes with await: the clear error, nothing uploaded. */
const AWAITED = `import { Sandbox, Templates, sandbox } from 'abx-sandbox';

const rate = await Promise.resolve(3);

@sandbox('data-tools')
export class Rates {
  @sandbox.register({ description: 'Convert' })
  convert(x: number) {
    return x * rate;
  }
}

await Templates.build('template.yaml');
await using box = await Sandbox.create({ template: 'data-tools' });
console.log('sandbox', box.sandboxId);
try {
  await box.server.start({ commands: [Rates] });
} catch (error) {
  const listing = await box.commands.run('ls -A ~/.abx/server/bundles 2>/dev/null; true');
  console.log('uploaded:', JSON.stringify(listing.stdout.trim()));
  throw error;
}
`;

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let project: ReturnType<typeof userProject>;

beforeAll(async () => {
  abx = await createAbxHome();
  project = userProject(TSCONFIG.compilerOptions, abx.home);
  writeFileSync(join(project.dir, 'template.yaml'), TEMPLATE);
  project.addScript('readme', README);
  project.addScript('main', MAIN);
  project.addScript('awaited', AWAITED);
  project.compile();
}, 300_000);

afterAll(async () => {
  await abx?.close();
  project?.remove();
});

function runScript(name: string) {
  rmSync(join(project.dir, 'side-effect.txt'), { force: true });
  return project.run(name);
}

/** The sandbox a script printed (`sandbox <id>`). */
function sandboxOf(stdout: string): string {
  const id = /^sandbox (i[a-z0-9]+)$/m.exec(stdout)?.[1];
  expect(id).toBeDefined();
  return id as string;
}

/** Whether the daemon (if one still runs) counts the sandbox as running, or processes of it remain. */
async function stillRunning(sandboxId: string): Promise<boolean> {
  const listed = await Sandbox.list({ home: abx.home, autoStart: false }).catch((error) => {
    if (error instanceof DaemonUnavailableError) return [];
    throw error;
  });
  const info = listed.find((s) => s.sandboxId === sandboxId);
  return info?.state === 'running' || sandboxProcesses(sandboxId).length > 0;
}

describe('the README example in one file', () => {
  test('with top-level await and `await using`: 42, the script stays on the host, nothing left running', async () => {
    const result = runScript('readme');
    expect(result.stderr).toBe('');
    expect(result.status).toBe(0);
    const lines = result.stdout.split('\n');
    expect(lines[0]).toBe('42');
    expect(result.stdout).toContain("stdout: 'Linux ");
    // The script's top-level code ran once, here, and never in the sandbox.
    expect(result.stdout).toContain('ran in the sandbox: false');
    // `await using` killed it when the script ended.
    expect(await stillRunning(sandboxOf(result.stdout))).toBe(false);
  }, 240_000);

  test('wrapped in main(): the same, and main() never runs in the sandbox', async () => {
    const result = runScript('main');
    expect(result.stderr).toBe('');
    expect(result.status).toBe(0);
    expect(result.stdout.split('\n').slice(0, 2)).toEqual(['42', 'ran in the sandbox: false']);
    expect(await stillRunning(sandboxOf(result.stdout))).toBe(false);
  }, 240_000);

  test('a class needing an awaited value: module:line and the fix, nothing uploaded, nothing left running', async () => {
    const result = runScript('awaited');
    expect(result.status).toBe(1);
    expect(result.stdout).toContain('uploaded: ""');
    expect(result.stderr).toContain('CommandDefinitionError');
    // The line of the module node ran (tsc's output) that holds `const rate = await`.
    const compiled = join(project.dir, 'dist', 'awaited.js');
    const line =
      readFileSync(compiled, 'utf8')
        .split('\n')
        .findIndex((text) => text.startsWith('const rate = await')) + 1;
    expect(line).toBeGreaterThan(0);
    expect(result.stderr).toContain(`${compiled}:${line}: cannot bundle Rates for the sandbox`);
    expect(result.stderr).toContain('`rate`');
    expect(result.stderr).toContain('module of its own');
    // The error left the script through `await using`, which killed the sandbox.
    expect(await stillRunning(sandboxOf(result.stdout))).toBe(false);
  }, 240_000);
});
