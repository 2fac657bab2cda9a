import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import { basename, join, relative } from 'node:path';
import { beforeAll, describe, expect, test } from 'vitest';
import { EDIT_INLINE_MAX_BYTES } from '../../src/agent/execute-runner.js';
import { helperCommand, MAX_COMMAND_CHARS } from '../../src/agent/helper.js';
import { programSource } from '../../src/agent/program-source.js';
import {
  CAPTURE_META_MARK,
  PROGRAM_NAMES,
  RESULT_MARK,
} from '../../src/agent/programs/protocol.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { sources, specifiers } from '../helpers/imports.js';

// BaseSandbox's sandbox-side programs: TypeScript in src/agent/programs, bundled by the build
// into dist/agent/<name>.cjs and sent as `node -e <text>` (see tsup.config.ts). The tools they
// run live in runtime/server/file-tools, which envd serves too.
const PROGRAMS = join(ROOT, 'src', 'agent', 'programs');
const FILE_TOOLS = join(ROOT, 'runtime', 'server', 'file-tools');
/** The modules programs share; every other file there is a program of its own. */
const SHARED = ['prelude.ts', 'protocol.ts'];

beforeAll(() => {
  ensureBuilt();
});

test('programs import only node: built-ins, their own folder and the file tools', () => {
  const files = sources(PROGRAMS);
  expect(files.length).toBeGreaterThan(5);
  const offending: string[] = [];
  for (const file of files) {
    for (const spec of specifiers(readFileSync(file, 'utf8'))) {
      const builtin = spec.startsWith('node:');
      const local = spec.startsWith('./') && !spec.slice(2).includes('/');
      const tool = join(file, '..', spec).startsWith(`${FILE_TOOLS}/`);
      if (!(builtin || local || tool)) offending.push(`${relative(ROOT, file)}: ${spec}`);
    }
  }
  expect(offending).toEqual([]);
});

test('the file tools import only node: built-ins and their own folder (they ride in programs)', () => {
  const files = sources(FILE_TOOLS);
  expect(files.length).toBeGreaterThan(5);
  const offending: string[] = [];
  for (const file of files) {
    for (const spec of specifiers(readFileSync(file, 'utf8'))) {
      const builtin = spec.startsWith('node:');
      const local = spec.startsWith('./') && !spec.slice(2).includes('/');
      if (!(builtin || local)) offending.push(`${relative(ROOT, file)}: ${spec}`);
    }
  }
  expect(offending).toEqual([]);
});

test('host code imports only protocol.ts from programs/ (importing a program runs it)', () => {
  const offending: string[] = [];
  for (const file of sources(join(ROOT, 'src')).filter((f) => !f.startsWith(PROGRAMS))) {
    for (const spec of specifiers(readFileSync(file, 'utf8'))) {
      if (spec.includes('programs/') && !spec.endsWith('programs/protocol.js')) {
        offending.push(`${relative(ROOT, file)}: ${spec}`);
      }
    }
  }
  expect(offending).toEqual([]);
});

test('every program file is built, and every built name has its file', () => {
  const programs = sources(PROGRAMS)
    .map((file) => basename(file))
    .filter((name) => !SHARED.includes(name))
    .map((name) => name.replace(/\.ts$/, ''));
  expect(programs.sort()).toEqual([...PROGRAM_NAMES].sort());
});

test('programs type-check with the ES2020 library only (their tsconfig; node 14 has all of it)', () => {
  const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
  execFileSync(process.execPath, [tsc, '-p', PROGRAMS], { cwd: ROOT, encoding: 'utf8' });
});

describe.each(PROGRAM_NAMES)('the built %s program', (name) => {
  test('is self-contained: it requires node built-ins only', () => {
    const text = programSource(name);
    const required = [...text.matchAll(/\brequire\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1]);
    expect(required.length).toBeGreaterThan(0);
    for (const module of required) expect(builtinModules).toContain(module);
    // Nothing that only a module file (not `node -e`) has.
    expect(text).not.toMatch(/import\.meta|__dirname|__filename|^\s*(import|export)\s/m);
  });

  test('runs as `node -e` and answers', () => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-program-'));
    try {
      if (name === 'capture') {
        const out = spawnSync(
          process.execPath,
          ['-e', programSource(name), join(dir, 'out.log'), '100', '1000'],
          { input: 'hello\n', encoding: 'utf8' },
        );
        expect(out.stdout).toBe(`${CAPTURE_META_MARK} 0 0\nhello\n`);
        return;
      }
      const out = spawnSync(process.execPath, ['-e', programSource(name)], {
        input: 'not json',
        encoding: 'utf8',
        cwd: dir,
      });
      expect(out.stderr).toBe('');
      expect(out.stdout).toBe(`\n${RESULT_MARK}{"error":"bad_payload"}\n`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

test('the largest inline edit fits in one command with its program', () => {
  const half = Buffer.alloc(EDIT_INLINE_MAX_BYTES / 2, 'é').toString('base64');
  const command = helperCommand('node', 'edit', {
    path: '/a/rather/long/path/to/some/file.txt',
    replaceAll: false,
    old: half,
    new: half,
  });
  expect(command.length).toBeLessThanOrEqual(MAX_COMMAND_CHARS);
});
