import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { expect, test } from 'vitest';
import { ROOT } from './harness.js';

const RUNTIME = join(ROOT, 'runtime');

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return /\.[cm]?[jt]s$/.test(entry.name) ? [path] : [];
  });
}

/** Every module specifier of a file: static imports, re-exports, dynamic import() and require(). */
function specifiers(text: string): string[] {
  const patterns = [
    /\b(?:import|export)\s[^'"`;]*?\bfrom\s*['"]([^'"]+)['"]/g,
    /\bimport\s*['"]([^'"]+)['"]/g,
    /\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)/g,
    /\brequire\s*\(\s*['"]([^'"]+)['"]\s*\)/g,
  ];
  return patterns.flatMap((pattern) => [...text.matchAll(pattern)].map((m) => m[1] as string));
}

test('runtime/ imports only node: built-ins and its own files', () => {
  const files = sources(RUNTIME);
  expect(files.length).toBeGreaterThan(10);
  const offending: string[] = [];
  for (const file of files) {
    for (const spec of specifiers(readFileSync(file, 'utf8'))) {
      const builtin = spec.startsWith('node:');
      const local = spec.startsWith('./') || spec.startsWith('../');
      const escapes = local && relative(RUNTIME, join(file, '..', spec)).startsWith('..');
      if (!(builtin || local) || escapes) offending.push(`${relative(ROOT, file)}: ${spec}`);
    }
  }
  expect(offending).toEqual([]);
});

test('the scanner catches what it must', () => {
  const text = `import a from 'undici';\nimport 'reflect-metadata';\nexport { b } from "fs";\nconst c = require('typedi');\nawait import('acorn');\nimport type { D } from '../../src/index.js';`;
  expect(specifiers(text).sort()).toEqual(
    ['../../src/index.js', 'acorn', 'fs', 'reflect-metadata', 'typedi', 'undici'].sort(),
  );
});
