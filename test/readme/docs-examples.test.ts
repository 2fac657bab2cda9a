import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { readmeBlock, readmeBlocks } from '../helpers/readme.js';

// Every ```ts block of the README and of docs/ is type-checked as a module of a user's project,
// with the README's tsconfig and the package as users import it (`abx-sandbox`, and the
// third-party packages the examples name: ai, openai, e2b, deepagents…). A block that shows a
// repository internal rather than user code is fenced ```ts fragment and left out. Names a
// fragment of a page takes from its context (the sandbox made above it, your model) are declared
// once, in PLACEHOLDERS.

const PLACEHOLDERS = `import type Anthropic from '@anthropic-ai/sdk';
import type { Sandbox } from 'abx-sandbox';
import type OpenAI from 'openai';

declare global {
  /** The sandbox an example made before (Sandbox.create()). */
  const sandbox: Sandbox;
  /** Your model and conversation, as each SDK takes them (never: whatever the SDK asks). */
  const model: never;
  const messages: never[];
  const input: string;
  const openai: OpenAI;
  const anthropic: Anthropic;
}
export {};
`;

interface Example {
  source: string;
  line: number;
  code: string;
}

function examples(): Example[] {
  const pages = [
    join(ROOT, 'README.md'),
    ...readdirSync(join(ROOT, 'docs'))
      .filter((name) => name.endsWith('.md'))
      .map((name) => join(ROOT, 'docs', name)),
  ];
  return pages.flatMap((page) =>
    readmeBlocks(page)
      .filter((block) => block.lang === 'ts')
      .map((block) => ({
        source: page.slice(ROOT.length + 1),
        line: block.line,
        code: block.code,
      })),
  );
}

const dir = mkdtempSync(join(tmpdir(), 'abx-docs-examples-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test('every TypeScript example of the README and docs/ type-checks in a project of its own', () => {
  ensureBuilt();
  const found = examples();
  // The README's own, and at least one page of docs/ each for lifecycle, ports, remote, E2B.
  for (const page of ['README.md', 'docs/lifecycle.md', 'docs/ports.md', 'docs/e2b.md']) {
    expect(
      found.some((e) => e.source === page),
      page,
    ).toBe(true);
  }
  const tsconfig = JSON.parse(
    readmeBlock('json', 'Use it in your project', 'compilerOptions').code,
  );
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ type: 'module', private: true }));
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { ...tsconfig.compilerOptions, noEmit: true, skipLibCheck: true },
      include: ['src'],
    }),
  );
  // The package as installed, and beside it what this checkout has (the third-party SDKs).
  mkdirSync(join(dir, 'node_modules'));
  for (const name of readdirSync(join(ROOT, 'node_modules'))) {
    if (name.startsWith('.')) continue;
    symlinkSync(join(ROOT, 'node_modules', name), join(dir, 'node_modules', name));
  }
  symlinkSync(ROOT, join(dir, 'node_modules', 'abx-sandbox'));
  mkdirSync(join(dir, 'src'));
  writeFileSync(join(dir, 'src', 'placeholders.d.ts'), PLACEHOLDERS);
  const files = new Map<string, Example>();
  for (const example of found) {
    const name = `${example.source.replace(/[/.]/g, '_')}_L${example.line}.ts`;
    files.set(`src/${name}`, example);
    // Each block is a module of its own (top-level await, no clashes between blocks).
    writeFileSync(join(dir, 'src', name), `${example.code}\nexport {};\n`);
  }
  const tsc = spawnSync(
    process.execPath,
    [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir],
    { cwd: dir, encoding: 'utf8', timeout: 180_000 },
  );
  // Each error said as where it is in the docs: README.md:673 (block line + its line - 1).
  const errors = (tsc.stdout + tsc.stderr)
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => {
      const at = /^(src\/[^(]+)\((\d+),\d+\): (.*)$/.exec(line);
      const example = at ? files.get(at[1] as string) : undefined;
      return example && at ? `${example.source}:${example.line + Number(at[2])}: ${at[3]}` : line;
    });
  expect(errors).toEqual([]);
  expect(found.length).toBeGreaterThanOrEqual(15);
  // The check can fail: an example that calls what the package does not have is an error.
  writeFileSync(
    join(dir, 'src', 'zz_wrong.ts'),
    "import { Template } from 'abx-sandbox';\nTemplate.base();\nexport {};\n",
  );
  const wrong = spawnSync(
    process.execPath,
    [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir],
    { cwd: dir, encoding: 'utf8', timeout: 180_000 },
  );
  expect(wrong.stdout).toMatch(/zz_wrong\.ts.*Property 'base' does not exist/);
}, 240_000);
