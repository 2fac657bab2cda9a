import { readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { expect, test } from 'vitest';
import { sources, specifiers } from '../helpers/imports.js';
import { ROOT } from './harness.js';

const RUNTIME = join(ROOT, 'runtime');

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
