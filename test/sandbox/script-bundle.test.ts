import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { CommandDefinitionError } from '../../src/errors.js';
import { BundleCache } from '../../src/sandbox/bundle-cache.js';
import { bundleCommands } from '../../src/sandbox/bundler.js';
import { ensureBuilt } from '../helpers/build.js';

// bundleCommands on scripts (real esbuild, real files): TypeScript sources, tsc output with a
// source map, and the cache noticing an edit of the script.

let dir: string;

const SCRIPT = (value: number) => `import { sandbox } from 'abx-sandbox';

const BASE: number = ${value};

@sandbox('tpl')
export class Tools {
  @sandbox.register()
  base(): number {
    return BASE;
  }
}

console.log('SIDE EFFECT');
await new Promise((resolve) => setTimeout(resolve, 1));
`;

const AWAITED = `import { sandbox } from 'abx-sandbox';

// a comment, so that lines differ between the TypeScript and its JavaScript
type Rate = number;
const rate: Rate = await Promise.resolve(3);

@sandbox('tpl')
export class Tools {
  @sandbox.register()
  convert(x: number): number {
    return x * rate;
  }
}
`;

beforeAll(() => {
  ensureBuilt();
  dir = mkdtempSync(join(tmpdir(), 'abx-script-bundle-'));
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ type: 'module' }));
});

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function message(run: () => Promise<unknown>): Promise<string> {
  return run().then(
    () => {
      throw new Error('no error');
    },
    (error) => {
      expect(error).toBeInstanceOf(CommandDefinitionError);
      return (error as Error).message;
    },
  );
}

const settle = () => new Promise((resolve) => setTimeout(resolve, 120));

describe('a script as the module of a command class', () => {
  test('a TypeScript source is cut down to the class', async () => {
    const file = join(dir, 'script.ts');
    writeFileSync(file, SCRIPT(40));
    const { code, inputs } = await bundleCommands([file], {}, { [file]: ['Tools'] });
    expect(code).toContain('BASE = 40');
    expect(code).not.toContain('SIDE EFFECT');
    expect(code).not.toContain('setTimeout');
    expect(inputs).toContain(file);
  });

  test('the error names the TypeScript line', async () => {
    const file = join(dir, 'awaited.ts');
    writeFileSync(file, AWAITED);
    const text = await message(() => bundleCommands([file], {}, { [file]: ['Tools'] }));
    expect(text).toMatch(new RegExp(`^${file}:5: cannot bundle Tools for the sandbox`));
  });

  test("tsc's output with a source map: the error names the .ts line", async () => {
    const output = ts.transpileModule(AWAITED, {
      fileName: join(dir, 'mapped.ts'),
      compilerOptions: {
        target: ts.ScriptTarget.ES2022,
        module: ts.ModuleKind.ESNext,
        experimentalDecorators: true,
        emitDecoratorMetadata: true,
        sourceMap: true,
      },
    });
    const file = join(dir, 'mapped.js');
    writeFileSync(file, output.outputText);
    writeFileSync(`${file}.map`, output.sourceMapText ?? '');
    const text = await message(() => bundleCommands([file], {}, { [file]: ['Tools'] }));
    expect(text).toMatch(new RegExp(`^${join(dir, 'mapped.ts')}:5: cannot bundle Tools`));
  });

  test('an edit of the script builds again; the cache keys on the classes kept too', async () => {
    const file = join(dir, 'cached.ts');
    writeFileSync(file, SCRIPT(1));
    // The cache trusts a file only once it is older than its clock's margin (50 ms here): a
    // file written within it could change again unseen in the same tick.
    await settle();
    const cache = new BundleCache(() => false);
    const first = await cache.bundle([file], {}, { [file]: ['Tools'] });
    expect(first.code).toContain('BASE = 1');
    expect((await cache.bundle([file], {}, { [file]: ['Tools'] })).sha256).toBe(first.sha256);
    expect(cache.stats.builds).toBe(1);
    writeFileSync(file, SCRIPT(2));
    await settle();
    const edited = await cache.bundle([file], {}, { [file]: ['Tools'] });
    expect(edited.code).toContain('BASE = 2');
    expect(edited.code).not.toContain('SIDE EFFECT');
    expect(cache.stats.builds).toBe(2);
  });
});
