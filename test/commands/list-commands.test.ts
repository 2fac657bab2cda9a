import { describe, expect, test } from 'vitest';
import {
  commandRegistry,
  DuplicateCommandError,
  int,
  listCommands,
  parseTemplate,
  sandbox,
  TemplateNotFoundError,
} from '../../src/index.js';

const YAML = `name: tools
custom_commands:
  head:
    description: First lines of a file
    command: head -n {lines} -- {path}
    args:
      - { name: path, type: str }
      - { name: lines, type: int, default: 5 }
`;

describe('listCommands', () => {
  test('merges YAML commands (file order) and decorated ones (definition order)', () => {
    const template = parseTemplate(YAML);
    @sandbox('tools')
    class Tools {
      @sandbox.register
      wordCount(path: string) {
        return path.length;
      }
    }
    expect(listCommands(template).map((c) => [c.name, c.source])).toEqual([
      ['head', 'yaml'],
      ['wordCount', 'decorator'],
    ]);
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('a YAML entry and a decorated method with the same signature give equal commands', () => {
    const [fromYaml] = parseTemplate(YAML).customCommands;
    @sandbox('tools')
    class Tools {
      @sandbox.register({ description: 'First lines of a file' })
      head(path: string, @int lines: number = 5) {
        return [path, lines];
      }
    }
    const [fromClass] = listCommands('tools');
    const { source: s1, command: c1, ...yamlRest } = fromYaml ?? ({} as never);
    const { source: s2, command: c2, ...classRest } = fromClass ?? ({} as never);
    expect([s1, s2]).toEqual(['yaml', 'decorator']);
    expect(c1).toBe('head -n {lines} -- {path}');
    expect(c2).toBeUndefined();
    expect(classRest).toEqual(yamlRest);
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('a name defined in YAML and in a class is an error naming both places', () => {
    const template = parseTemplate(YAML, 'tools/template.yaml');
    @sandbox('tools')
    class Tools {
      @sandbox.register
      head(path: string) {
        return path;
      }
    }
    expect(() => listCommands(template)).toThrow(DuplicateCommandError);
    expect(() => listCommands(template)).toThrow(
      "command 'head' is defined twice in template 'tools': at tools/template.yaml:3:3 and at Tools.head; rename or remove one of them",
    );
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('a name defined in two classes of one template is an error naming both', () => {
    @sandbox('tools')
    class First {
      @sandbox.register
      run() {
        return 1;
      }
    }
    @sandbox('tools')
    class Second {
      @sandbox.register({ name: 'run' })
      go() {
        return 2;
      }
    }
    expect(() => listCommands('tools')).toThrow(/defined twice .*at First\.run and at Second\.go/);
    expect(commandRegistry().registeredClasses()).toEqual([First, Second]);
  });

  test('the same name in two templates is fine', () => {
    @sandbox('a')
    class A {
      @sandbox.register
      run() {
        return 1;
      }
    }
    @sandbox('b')
    class B {
      @sandbox.register
      run(x: string) {
        return x;
      }
    }
    expect(listCommands('a')[0]?.args).toHaveLength(0);
    expect(listCommands('b')[0]?.args).toHaveLength(1);
    expect(commandRegistry().registeredClasses()).toEqual([A, B]);
  });

  test('an unknown template name lists the known ones', () => {
    @sandbox('known')
    class Known {
      @sandbox.register
      run() {
        return 1;
      }
    }
    expect(() => listCommands('unknown')).toThrow(TemplateNotFoundError);
    expect(() => listCommands('unknown')).toThrow(
      "unknown template 'unknown'; known templates: known",
    );
    expect(commandRegistry().registeredClasses()).toEqual([Known]);
  });
});
