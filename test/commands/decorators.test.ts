import { describe, expect, test } from 'vitest';
import {
  arg,
  CommandDefinitionError,
  commandRegistry,
  float,
  int,
  listCommands,
  sandbox,
} from '../../src/index.js';

/** Runs `define` (which declares a decorated class) and returns the error it throws. */
function definitionError(define: () => unknown): CommandDefinitionError {
  try {
    define();
  } catch (error) {
    expect(error).toBeInstanceOf(CommandDefinitionError);
    return error as CommandDefinitionError;
  }
  throw new Error('expected the class definition to fail');
}

describe('@sandbox.register reads the method', () => {
  test('names, literal defaults and reflected types become typed arguments', () => {
    @sandbox('tools')
    class Tools {
      @sandbox.register
      summarize(path: string, @int top: number = 10, ratio: number = 0.5, verbose = false) {
        return { path, top, ratio, verbose };
      }
    }
    const [command] = listCommands('tools');
    expect(command).toMatchObject({
      name: 'summarize',
      description: '',
      template: 'tools',
      source: 'decorator',
      args: [
        { name: 'path', type: 'str', required: true },
        { name: 'top', type: 'int', required: false, default: 10 },
        { name: 'ratio', type: 'float', required: false, default: 0.5 },
        { name: 'verbose', type: 'bool', required: false, default: false },
      ],
    });
    expect(command?.args[0]).not.toHaveProperty('default');
    expect(Tools.name).toBe('Tools');
  });

  test('number reflects as float; @int, @float and @arg override it', () => {
    @sandbox('tools')
    class Tools {
      @sandbox.register
      scale(
        a: number,
        @int b: number,
        @float c: number,
        @arg({ type: 'int', description: 'how many' }) d: number,
      ) {
        return a + b + c + d;
      }
    }
    expect(listCommands('tools')[0]?.args).toEqual([
      { name: 'a', type: 'float', required: true },
      { name: 'b', type: 'int', required: true },
      { name: 'c', type: 'float', required: true },
      { name: 'd', type: 'int', required: true, description: 'how many' },
    ]);
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('an unannotated parameter takes the type of its literal default', () => {
    @sandbox('tools')
    class Tools {
      @sandbox.register
      defaults(i = 2, f = 2.5, s = 'x', b = true, n = -3, t = `plain`) {
        return [i, f, s, b, n, t];
      }
    }
    expect(listCommands('tools')[0]?.args.map((a) => [a.name, a.type, a.default])).toEqual([
      ['i', 'int', 2],
      ['f', 'float', 2.5],
      ['s', 'str', 'x'],
      ['b', 'bool', true],
      ['n', 'int', -3],
      ['t', 'str', 'plain'],
    ]);
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('a real parser reads names: comments, strings with // and = and parens in defaults', () => {
    @sandbox('tools')
    class Tools {
      @sandbox.register
      tricky(
        /* a comment, with = and ) */ url: string = 'http://x/(a)=b',
        // a line comment: fake = 3,
        sep: string = ',',
        @int count: number = 0x10,
      ) {
        return [url, sep, count];
      }
    }
    expect(listCommands('tools')[0]?.args.map((a) => [a.name, a.default])).toEqual([
      ['url', 'http://x/(a)=b'],
      ['sep', ','],
      ['count', 16],
    ]);
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('options set the name, description and timeout; async methods work', () => {
    @sandbox({ template: 'tools' })
    class Tools {
      @sandbox.register({ name: 'fetch-page', description: 'Fetch a page', timeoutMs: 5000 })
      async fetchPage(url: string) {
        return url;
      }
    }
    expect(listCommands('tools')[0]).toMatchObject({
      name: 'fetch-page',
      description: 'Fetch a page',
      timeoutMs: 5000,
      args: [{ name: 'url', type: 'str', required: true }],
    });
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('bare @sandbox puts the commands in the base template', () => {
    @sandbox
    class Tools {
      @sandbox.register
      ping() {
        return 'pong';
      }
    }
    expect(listCommands('base').map((c) => c.name)).toEqual(['ping']);
    expect(commandRegistry().registeredClasses()).toEqual([Tools]);
  });

  test('a subclass inherits registered methods and can override them', () => {
    class Base {
      @sandbox.register
      hello(name: string) {
        return name;
      }

      @sandbox.register
      bye(name: string) {
        return name;
      }
    }
    @sandbox('tools')
    class Child extends Base {
      @sandbox.register({ description: 'overridden' })
      override hello(name: string, @int times: number = 1) {
        return name.repeat(times);
      }
    }
    const commands = listCommands('tools');
    expect(commands.map((c) => [c.name, c.description, c.args.length])).toEqual([
      ['hello', 'overridden', 2],
      ['bye', '', 1],
    ]);
    expect(commandRegistry().registeredClasses()).toEqual([Child]);
  });
});

describe('decorator misuse fails when the class is defined', () => {
  test.each([
    [
      'an object type',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(options: object) {
            return options;
          }
        }
        return Bad;
      },
      /Bad\.run\(options\): its type cannot be read .*declare it as string, number or boolean/,
    ],
    [
      'an array type',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(items: string[]) {
            return items;
          }
        }
        return Bad;
      },
      /Bad\.run\(items\): type Array is not supported; declare it as string, number \(with @int for integers\) or boolean/,
    ],
    [
      'a union type',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(value: string | number) {
            return value;
          }
        }
        return Bad;
      },
      /Bad\.run\(value\): its type cannot be read \(any, unknown, object, a union/,
    ],
    [
      'a class type',
      () => {
        class Point {}
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(point: Point) {
            return point;
          }
        }
        return Bad;
      },
      /Bad\.run\(point\): type Point is not supported/,
    ],
    [
      'a destructured parameter',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run({ a }: { a: string }) {
            return a;
          }
        }
        return Bad;
      },
      /Bad\.run\(\{ a \}\): a destructured parameter cannot be a command argument; take one named parameter per argument/,
    ],
    [
      'a rest parameter',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(...names: string[]) {
            return names;
          }
        }
        return Bad;
      },
      /Bad\.run\(\.\.\.names\): a rest parameter cannot be a command argument/,
    ],
    [
      'a non-literal default',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(when: number = Date.now()) {
            return when;
          }
        }
        return Bad;
      },
      /Bad\.run\(when\): default `Date\.now\(\)` is not a literal; write a string, number or boolean literal, or no default/,
    ],
    [
      'an int default that is not whole',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(@int n: number = 2.5) {
            return n;
          }
        }
        return Bad;
      },
      /Bad\.run\(n\): default 2\.5 is not a valid int; write a whole number, or declare the parameter with @float/,
    ],
    [
      '@int on a string parameter',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(@int n: string) {
            return n;
          }
        }
        return Bad;
      },
      /Bad\.run\(n\): @int makes it int but it is declared string; declare it as number/,
    ],
    [
      'two decorators that disagree',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run(@int @arg({ type: 'float' }) n: number) {
            return n;
          }
        }
        return Bad;
      },
      /Bad\.run\(n\): .*says (int|float) but .*says (int|float); keep one/,
    ],
    [
      'a static method',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          static run() {
            return 1;
          }
        }
        return Bad;
      },
      /Bad\.run: @sandbox\.register is on a static method; make it an instance method/,
    ],
    [
      'a built-in command name',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          upload(path: string) {
            return path;
          }
        }
        return Bad;
      },
      /Bad\.upload: command name "upload" is a built-in command of the server; pass another with @sandbox\.register\(\{ name: '\.\.\.' \}\)/,
    ],
    [
      'a command name that cannot travel in a URL',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register({ name: 'two words' })
          run() {
            return 1;
          }
        }
        return Bad;
      },
      /Bad\.run: command name "two words" must start with a letter or _ and contain only letters, digits, _ and -/,
    ],
    [
      'a non-positive timeout',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register({ timeoutMs: 0 })
          run() {
            return 1;
          }
        }
        return Bad;
      },
      /Bad\.run: timeoutMs must be positive/,
    ],
    [
      'a class that registers nothing',
      () => {
        @sandbox('t')
        class Empty {
          run() {
            return 1;
          }
        }
        return Empty;
      },
      /Empty is decorated with @sandbox but registers no command; add @sandbox\.register/,
    ],
    [
      'a bad template name',
      () => {
        @sandbox('no spaces please')
        class Bad {
          @sandbox.register
          run() {
            return 1;
          }
        }
        return Bad;
      },
      /Bad: @sandbox\("no spaces please"\) needs a template name/,
    ],
    [
      '@int on a method that is not registered',
      () => {
        @sandbox('t')
        class Bad {
          @sandbox.register
          run() {
            return 1;
          }

          helper(@int n: number) {
            return n;
          }
        }
        return Bad;
      },
      /@int on Bad\.helper\(parameter 1\) has no effect: only parameters of methods decorated with @sandbox\.register/,
    ],
  ])('%s', (_, define, message) => {
    expect(definitionError(define).message).toMatch(message);
  });

  test('every problem of a class is reported at once', () => {
    const error = definitionError(() => {
      @sandbox('t')
      class Bad {
        @sandbox.register
        one(items: string[]) {
          return items;
        }

        @sandbox.register
        two(@int n: number = 1.5) {
          return n;
        }
      }
      return Bad;
    });
    expect(error.message).toContain('Bad defines its commands wrongly:');
    expect(error.message).toContain('Bad.one(items): type Array is not supported');
    expect(error.message).toContain('Bad.two(n): default 1.5 is not a valid int');
  });

  test('a failed class registers nothing', () => {
    definitionError(() => {
      @sandbox('half')
      class Bad {
        @sandbox.register
        good(x: string) {
          return x;
        }

        @sandbox.register
        bad(items: string[]) {
          return items;
        }
      }
      return Bad;
    });
    expect(() => listCommands('half')).toThrow(/unknown template 'half'/);
  });
});
