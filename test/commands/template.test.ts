import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, test } from 'vitest';
import { listCommands, loadTemplate, parseTemplate, TemplateError } from '../../src/index.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'abx-template-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

function writeTemplate(text: string): string {
  const file = join(dir, 'template.yaml');
  writeFileSync(file, text);
  return file;
}

function templateError(text: string): TemplateError {
  try {
    parseTemplate(text, 'template.yaml');
  } catch (error) {
    expect(error).toBeInstanceOf(TemplateError);
    return error as TemplateError;
  }
  throw new Error('expected the template to be refused');
}

const TRAIN = `name: ml
custom_commands:
  train:
    description: Train a model
    command: python train.py --epochs {epochs} --lr {lr}
    timeout: 5m
    args:
      - { name: epochs, type: int, description: passes over the data }
      - { name: lr, type: float, default: 0.01 }
`;

describe('loadTemplate', () => {
  test('reads name, capabilities and custom commands into the command model', () => {
    const template = loadTemplate(writeTemplate(TRAIN));
    expect(template).toMatchObject({
      name: 'ml',
      capabilities: ['shell', 'files', 'code'],
      path: join(dir, 'template.yaml'),
    });
    expect(template.customCommands).toEqual([
      {
        name: 'train',
        description: 'Train a model',
        template: 'ml',
        source: 'yaml',
        command: 'python train.py --epochs {epochs} --lr {lr}',
        timeoutMs: 300_000,
        args: [
          { name: 'epochs', type: 'int', required: true, description: 'passes over the data' },
          { name: 'lr', type: 'float', required: false, default: 0.01 },
        ],
      },
    ]);
    expect(template.places.train).toBe(`${join(dir, 'template.yaml')}:3:3`);
  });

  test('makes the template known by name to listCommands', () => {
    expect(() => listCommands('ml')).toThrow(/unknown template 'ml'/);
    loadTemplate(writeTemplate(TRAIN));
    expect(listCommands('ml').map((c) => c.name)).toEqual(['train']);
  });

  test('capabilities are a subset of shell, files, code, ports', () => {
    const template = parseTemplate('name: t\ncapabilities: [ports, shell, ports]\n');
    expect(template.capabilities).toEqual(['ports', 'shell']);
  });

  test('an arg without type takes the type of its default, else str', () => {
    const template = parseTemplate(`name: t
custom_commands:
  c:
    command: echo {a} {b} {c} {d}
    args: [{ name: a }, { name: b, default: 3 }, { name: c, default: 0.5 }, { name: d, default: yes }]
`);
    expect(template.customCommands[0]?.args.map((a) => [a.name, a.type])).toEqual([
      ['a', 'str'],
      ['b', 'int'],
      ['c', 'float'],
      ['d', 'str'],
    ]);
  });

  test('resources take cores of CPU and a disk size; bad values name the key', () => {
    const template = parseTemplate('name: t\nresources: { cpu: 0.5, disk: 512M, memory: 1G }\n');
    expect(template.resources).toEqual({ cpu: 0.5, disk: 512 * 1024 ** 2, memory: 1024 ** 3 });
    expect(parseTemplate('name: t\nresources: { cpu: "2" }\n').resources.cpu).toBe(2);
    expect(templateError('name: t\nresources: { cpu: 0 }\n').message).toMatch(
      /resources\.cpu: must be a number of cores from 0\.01 to 1024/,
    );
    expect(templateError('name: t\nresources: { cpu: lots }\n').message).toMatch(/resources\.cpu/);
    expect(templateError('name: t\nresources: { disk: huge }\n').message).toMatch(
      /resources\.disk: must be a size such as 64M or 2G/,
    );
  });

  test('allow_root: true is for image templates only; anything but a boolean says so', () => {
    expect(parseTemplate('name: t\nimage: debian:12\nallow_root: true\n').allowRoot).toBe(true);
    expect(
      parseTemplate('name: t\nimage: debian:12\nallow_root: false\n').allowRoot,
    ).toBeUndefined();
    expect(templateError('name: t\nallow_root: true\n').message).toMatch(
      /^template\.yaml:2:13: allow_root: only an image template \(image: or dockerfile:\) can allow root/,
    );
    expect(templateError('name: t\nimage: debian:12\nallow_root: yes\n').message).toMatch(
      /allow_root: must be true or false/,
    );
  });

  test('runtime: { node } names the Node line the sandboxes need; anything else says what it must be', () => {
    expect(parseTemplate('name: t\nruntime: { node: 24 }\n').runtime).toEqual({ node: 24 });
    expect(parseTemplate('name: t\nruntime:\n  node: "22"\n').runtime).toEqual({ node: 22 });
    expect(parseTemplate('name: t\n').runtime).toBeUndefined();
    expect(templateError('name: t\nruntime: { node: 24.1 }\n').message).toBe(
      'template.yaml:2:18: runtime.node: must be a Node line: its major version as a whole number, such as 22, 24 or 26',
    );
    expect(templateError('name: t\nruntime: { node: v24 }\n').message).toMatch(
      /runtime\.node: must be a Node line/,
    );
    expect(templateError('name: t\nruntime: {}\n').message).toMatch(
      /runtime: missing `node:`, the Node line the sandboxes need, such as 24/,
    );
    expect(templateError('name: t\nruntime: { python: 3 }\n').message).toMatch(/runtime\.python/);
    expect(templateError('name: t\nruntime: 24\n').message).toMatch(
      /runtime: must be a mapping such as \{ node: 24 \}/,
    );
  });

  test('a file that cannot be read is a TemplateError naming it', () => {
    expect(() => loadTemplate(join(dir, 'missing.yaml'))).toThrow(
      /missing\.yaml: cannot read template: ENOENT/,
    );
  });
});

describe('template errors say where and what', () => {
  test('YAML syntax errors report file:line:column', () => {
    const error = templateError('name: t\ncustom_commands:\n  a: [1, 2\n');
    expect(error.location).toBe('template.yaml:4:1');
    expect(error.message).toMatch(/^template\.yaml:4:1: invalid YAML: /);
  });

  test('a key given twice is a syntax error at the second one', () => {
    const error = templateError('name: a\nname: b\n');
    expect(error.message).toMatch(/^template\.yaml:2:1: invalid YAML: Map keys must be unique/);
  });

  test('a bad arg type reports the key path', () => {
    const error = templateError(`name: ml
custom_commands:
  train:
    command: python train.py {epochs}
    args:
      - { name: epochs, type: integer }
`);
    expect(error.message).toBe(
      'template.yaml:6:31: custom_commands.train.args[0].type: must be one of str, int, float, bool',
    );
  });

  test.each([
    [
      'a missing name',
      'custom_commands: {}\n',
      'template.yaml:1:1: name: missing; every template needs a name',
    ],
    ['a bad name', 'name: two words\n', 'template.yaml:1:7: name: must be a name of letters'],
    [
      'an unknown top-level key',
      'name: t\nbase_image: ubuntu\n',
      'template.yaml:2:13: base_image: unknown key; allowed here: name, description, capabilities, custom_commands, image,',
    ],
    [
      'an unknown capability',
      'name: t\ncapabilities: [shell, gpu]\n',
      'capabilities[1]: must be one of shell, files, code, ports',
    ],
    ['capabilities not a list', 'name: t\ncapabilities: shell\n', 'capabilities: must be a list'],
    [
      'custom_commands not a mapping',
      'name: t\ncustom_commands: [a]\n',
      'custom_commands: must be a mapping of command name → definition',
    ],
    [
      'a command without command:',
      'name: t\ncustom_commands:\n  c:\n    description: x\n',
      'custom_commands.c: missing `command:`',
    ],
    [
      'an unknown command key',
      'name: t\ncustom_commands:\n  c:\n    command: ls\n    cmd: ls\n',
      'custom_commands.c.cmd: unknown key; allowed here: description, command, args, timeout',
    ],
    [
      'an unknown arg key',
      'name: t\ncustom_commands:\n  c:\n    command: ls {a}\n    args: [{ name: a, requird: true }]\n',
      'custom_commands.c.args[0].requird: unknown key; allowed here: name, type, default, description',
    ],
    [
      'a default of the wrong type',
      'name: t\ncustom_commands:\n  c:\n    command: ls {n}\n    args: [{ name: n, type: int, default: 2.5 }]\n',
      'custom_commands.c.args[0].default: 2.5 is not a valid int',
    ],
    [
      'an arg named twice',
      'name: t\ncustom_commands:\n  c:\n    command: ls {n}\n    args: [{ name: n }, { name: n }]\n',
      'custom_commands.c.args: names an argument twice',
    ],
    [
      'an arg name that is not an identifier',
      'name: t\ncustom_commands:\n  c:\n    command: ls\n    args: [{ name: my-arg }]\n',
      'custom_commands.c.args[0].name: must be an identifier',
    ],
    [
      'a built-in command name',
      'name: t\ncustom_commands:\n  runshell:\n    command: ls\n',
      'custom_commands.runshell: command name is a built-in command of the server',
    ],
    [
      'a bad timeout',
      'name: t\ncustom_commands:\n  c:\n    command: ls\n    timeout: soon\n',
      'custom_commands.c.timeout: must be a duration such as 30s, 5m or 1h',
    ],
    [
      'a placeholder naming no arg',
      'name: t\ncustom_commands:\n  c:\n    command: cat {path} {pth}\n    args: [{ name: path }]\n',
      'custom_commands.c.command: placeholder {pth} names no declared argument (declared: path); declare it under args, or write {{pth}} for literal braces',
    ],
    [
      'a placeholder in single quotes',
      "name: t\ncustom_commands:\n  c:\n    command: echo '{msg}'\n    args: [{ name: msg }]\n",
      'custom_commands.c.command: placeholder {msg} is inside single quotes',
    ],
    [
      'a template that is not a mapping',
      '- a\n- b\n',
      'template.yaml:1:1: a template is a mapping',
    ],
  ])('%s', (_, text, expected) => {
    expect(templateError(text).message).toContain(expected);
  });

  test('every problem is reported at once, each with its location', () => {
    const error = templateError(`name: t
capabilities: [gpu]
custom_commands:
  c:
    command: ls {x}
`);
    const lines = error.message.split('\n');
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(/^template\.yaml:2:16: capabilities\[0\]: must be one of/);
    expect(lines[1]).toMatch(
      /^template\.yaml:5:14: custom_commands\.c\.command: placeholder \{x\}/,
    );
  });
});
