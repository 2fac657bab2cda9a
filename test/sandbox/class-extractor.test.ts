import ts from 'typescript';
import { describe, expect, test } from 'vitest';
import { CommandDefinitionError } from '../../src/errors.js';
import { extractCommandClasses } from '../../src/sandbox/class-extractor.js';

// The extractor reads what tsc emits for a user's script; these are tsc's own outputs of a few
// shapes, in both module formats a project may compile to.
const FORMATS = { esm: ts.ModuleKind.ESNext, cjs: ts.ModuleKind.CommonJS } as const;

function compile(source: string, format: keyof typeof FORMATS): string {
  return ts.transpileModule(source, {
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: FORMATS[format],
      experimentalDecorators: true,
      emitDecoratorMetadata: true,
      useDefineForClassFields: false,
      esModuleInterop: true,
    },
  }).outputText;
}

const HEADER = `import { Sandbox, Templates, int, sandbox } from 'abx-sandbox';
import { readFileSync } from 'node:fs';
import { join as joinPath } from 'node:path';
`;

const CLASS = `
const LIMITS = { max: 100 };
function clamp(n: number): number { return Math.min(n, LIMITS.max); }
function unused() { return 'UNUSED HELPER'; }

@sandbox('data-tools')
export class DataTools {
  static prefix = 'sum:';
  static make() { return new DataTools(); }
  @sandbox.register({ description: 'Add two numbers' })
  add(x: number, @int y: number = 2) { return clamp(x + y); }
  @sandbox.register()
  read(path: string) { return readFileSync(joinPath('/', path), 'utf8'); }
}
`;

const SCRIPT = `
await Templates.build('template.yaml');
const box = await Sandbox.create({ template: 'data-tools' });
await box.server.start({ commands: [DataTools] });
console.log('SIDE EFFECT', await box.server.call('add', { x: 40 }));
await box.kill();
`;

for (const format of ['esm', 'cjs'] as const) {
  describe(`tsc's ${format} output`, () => {
    test('a module of declarations only is left to be bundled whole', () => {
      expect(extractCommandClasses('/m.js', compile(HEADER + CLASS, format), ['DataTools'])).toBe(
        undefined,
      );
    });

    test('the class, its decorators, statics and what its methods use stay; the script goes', () => {
      if (format === 'cjs') return; // tsc refuses top-level await in CommonJS; see main() below
      const source = compile(HEADER + CLASS + SCRIPT, format);
      const code = extractCommandClasses('/script.js', source, ['DataTools']) as string;
      expect(code).toContain('class DataTools');
      expect(code).toContain('__decorate([');
      expect(code).toContain("sandbox('data-tools')");
      expect(code).toContain('function clamp');
      expect(code).toContain('const LIMITS = { max: 100 }');
      expect(code).toContain("from 'abx-sandbox'");
      expect(code).toContain("from 'node:fs'");
      expect(code).toContain("from 'node:path'");
      expect(code).toContain('export { DataTools }');
      for (const gone of ['SIDE EFFECT', 'Templates.build', 'Sandbox.create', 'UNUSED HELPER']) {
        expect(code).not.toContain(gone);
      }
      // Lines stay where they were: stack traces in the sandbox point at the script.
      expect(code.split('\n').length).toBe(source.split('\n').length);
      const line = (text: string, s: string) => text.split('\n').findIndex((l) => l.includes(s));
      expect(line(code, 'function clamp')).toBe(line(source, 'function clamp'));
    });

    test('a main() call, and main itself, are left out', () => {
      const main = `\nasync function main() {\n${SCRIPT}\n}\nmain().catch((e) => { console.error(e); process.exit(1); });\n`;
      const code = extractCommandClasses('/script.js', compile(HEADER + CLASS + main, format), [
        'DataTools',
      ]) as string;
      expect(code).toContain('class DataTools');
      expect(code).toContain('function clamp');
      expect(code).not.toContain('main');
      expect(code).not.toContain('SIDE EFFECT');
      if (format === 'cjs') {
        expect(code).toContain('require("abx-sandbox")');
        expect(code).toContain('exports.DataTools = DataTools');
      }
    });

    test('of two decorated classes, only the ones asked for stay', () => {
      const two = `${HEADER}${CLASS}
@sandbox('other')
export class Other {
  @sandbox.register()
  hello(): string { return 'OTHER CLASS'; }
}
main();
function main() { console.log('SIDE EFFECT'); }
`;
      const source = compile(two, format);
      const one = extractCommandClasses('/two.js', source, ['DataTools']) as string;
      expect(one).toContain('class DataTools');
      expect(one).not.toContain('OTHER CLASS');
      const both = extractCommandClasses('/two.js', source, ['DataTools', 'Other']) as string;
      expect(both).toContain('class DataTools');
      expect(both).toContain('OTHER CLASS');
      expect(both).not.toContain('SIDE EFFECT');
    });

    test('a default-exported class (tsc names it default_1)', () => {
      const source = compile(
        `import { sandbox } from 'abx-sandbox';
const GREETING = 'hello';
@sandbox('tpl')
export default class {
  @sandbox.register()
  greet(name: string) { return GREETING + ' ' + name; }
}
console.log('SIDE EFFECT');
`,
        format,
      );
      const code = extractCommandClasses('/default.js', source, ['default_1']) as string;
      expect(code).toContain("const GREETING = 'hello'");
      expect(code).toMatch(/export default default_1|exports.default = default_1/);
      expect(code).not.toContain('SIDE EFFECT');
    });

    test('top-level code that only changes what the class uses runs with it', () => {
      const source = compile(
        `import { sandbox } from 'abx-sandbox';
const settings: Record<string, number> = {};
settings.base = 40;
let scale = 1;
scale = 2;
@sandbox('tpl')
export class Tools {
  @sandbox.register()
  value(): number { return settings.base * scale; }
}
console.log('SIDE EFFECT');
`,
        format,
      );
      const code = extractCommandClasses('/changes.js', source, ['Tools']) as string;
      expect(code).toContain('settings.base = 40');
      expect(code).toContain('scale = 2');
      expect(code).not.toContain('SIDE EFFECT');
    });

    test('names a method shadows are not taken from the script', () => {
      const source = compile(
        `import { sandbox } from 'abx-sandbox';
const box = main();
@sandbox('tpl')
export class Tools {
  @sandbox.register()
  echo(box: string): string { const main = (s: string) => s; return main(box); }
}
function main() { return 'SIDE EFFECT'; }
console.log(box);
`,
        format,
      );
      const code = extractCommandClasses('/shadow.js', source, ['Tools']) as string;
      expect(code).toContain('class Tools');
      expect(code).not.toContain('SIDE EFFECT');
      expect(code).not.toContain('const box');
    });
  });
}

describe('what cannot be separated fails with module:line and the fix', () => {
  /** The message, and the line of the compiled module that holds `text`. */
  const error = (source: string, text: string) => {
    const compiled = compile(source, 'esm');
    const line = compiled.split('\n').findIndex((l) => l.includes(text)) + 1;
    try {
      extractCommandClasses('/work/script.js', compiled, ['Tools']);
    } catch (e) {
      expect(e).toBeInstanceOf(CommandDefinitionError);
      expect(line).toBeGreaterThan(0);
      expect((e as Error).message).toMatch(
        new RegExp(`^/work/script\\.js:${line}: cannot bundle Tools for the sandbox`),
      );
      return (e as Error).message;
    }
    throw new Error('no error');
  };

  test('a value the class uses, computed with top-level await', () => {
    const message = error(
      `import { sandbox } from 'abx-sandbox';
const rate = await fetch('http://127.0.0.1:9/rate').then((r) => r.json());
@sandbox('tpl')
export class Tools {
  @sandbox.register()
  convert(x: number): number { return x * rate; }
}
`,
      'const rate = await',
    );
    expect(message).toContain('`rate`');
    expect(message).toContain('await');
    expect(message).toContain('module of its own');
  });

  test('a binding the class uses, changed by top-level code after an await', () => {
    const message = error(
      `import { sandbox } from 'abx-sandbox';
let rate = 1;
@sandbox('tpl')
export class Tools {
  @sandbox.register()
  convert(x: number): number { return x * rate; }
}
rate = await Promise.resolve(3);
`,
      'rate = await',
    );
    expect(message).toContain('`rate`');
    expect(message).toContain('module of its own');
  });

  test('a binding the class uses, changed by a function the script calls', () => {
    const message = error(
      `import { sandbox } from 'abx-sandbox';
let rate = 1;
@sandbox('tpl')
export class Tools {
  @sandbox.register()
  convert(x: number): number { return x * rate; }
}
function configure(r: number) { rate = r; }
configure(Number(process.argv[2]));
`,
      'function configure',
    );
    expect(message).toContain('`rate`');
    expect(message).toContain('would not see that change');
  });

  test('a class declared inside main()', () => {
    const message = error(
      `import { sandbox } from 'abx-sandbox';
async function main() {
  @sandbox('tpl')
  class Tools {
    @sandbox.register()
    one(): number { return 1; }
  }
  return Tools;
}
await main();
`,
      'let Tools = class',
    );
    expect(message).toContain('not declared at the top level');
  });
});
