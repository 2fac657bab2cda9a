import { execFileSync } from 'node:child_process';
import fc from 'fast-check';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { SandboxServer } from '../../runtime/server/server.js';
import {
  ArgumentError,
  type CustomCommand,
  parseCommandArgs,
  parseTemplate,
  renderShellCommand,
  validateKwargs,
} from '../../src/index.js';

// Property-based cases (fast-check) beside the hand-written ones: generated inputs, fixed seeds
// so a failure replays.
const SEED = 20261130;

const [command] = parseTemplate(`name: props
custom_commands:
  echo:
    command: printf '%s|' {text} {n} {ratio} {flag}
    args:
      - { name: text, type: str }
      - { name: n, type: int, default: 1 }
      - { name: ratio, type: float, default: 0.5 }
      - { name: flag, type: bool, default: false }
`).customCommands as [CustomCommand];

const jsonValue = fc.oneof(
  fc.string(),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.integer(), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 4 }), fc.integer(), { maxKeys: 2 }),
);
const kwargs = fc.dictionary(
  fc.oneof(fc.constantFrom('text', 'n', 'ratio', 'flag', 'txt', '__proto__'), fc.string()),
  jsonValue,
  { maxKeys: 6 },
);

/** A value of an argument type, for the round trip through CLI words. */
const typed = {
  str: fc.string().filter((s) => !s.includes('\0')),
  int: fc.integer(),
  // String(-0) is "0": the one float whose text does not say it.
  float: fc.double({ noNaN: true, noDefaultInfinity: true }).filter((x) => !Object.is(x, -0)),
  bool: fc.boolean(),
} as const;

/** The result, or the problems of the ArgumentError. */
function outcome(run: () => unknown): unknown {
  try {
    return { ok: run() };
  } catch (error) {
    if (!(error instanceof ArgumentError)) throw error;
    return { problems: error.problems };
  }
}

describe('the one kwargs validator', () => {
  test('any JSON kwargs: either every argument fits its type, or an ArgumentError lists why', () => {
    fc.assert(
      fc.property(kwargs, (value) => {
        let result: Record<string, unknown>;
        try {
          result = validateKwargs(command, value);
        } catch (error) {
          expect(error).toBeInstanceOf(ArgumentError);
          expect((error as ArgumentError).problems.length).toBeGreaterThan(0);
          return;
        }
        expect(Object.keys(result).sort()).toEqual(['flag', 'n', 'ratio', 'text']);
        for (const arg of command.args) {
          const given = (value as Record<string, unknown>)[arg.name];
          expect(result[arg.name]).toEqual(Object.hasOwn(value, arg.name) ? given : arg.default);
        }
      }),
      { seed: SEED, numRuns: 1000 },
    );
  });

  test('CLI words of well-typed values give the same kwargs as the JSON call', () => {
    fc.assert(
      fc.property(
        fc.record(
          { text: typed.str, n: typed.int, ratio: typed.float, flag: typed.bool },
          { requiredKeys: ['text'] },
        ),
        (value) => {
          const words = Object.entries(value).map(([k, v]) => `${k}=${v}`);
          expect(parseCommandArgs(command, words)).toEqual(validateKwargs(command, value));
        },
      ),
      { seed: SEED, numRuns: 500 },
    );
  });
});

describe('YAML placeholders', () => {
  test('any text value reaches the command literally, whatever shell syntax it holds', () => {
    fc.assert(
      fc.property(
        fc.string({ unit: 'binary', maxLength: 40 }).filter((s) => !s.includes('\0')),
        (text) => {
          const script = renderShellCommand(command, validateKwargs(command, { text }));
          const output = execFileSync('sh', ['-c', script], { encoding: 'utf8' });
          expect(output).toBe(`${text}|1|0.5|false|`);
        },
      ),
      { seed: SEED, numRuns: 200 },
    );
  });

  test('-a values: integers round-trip, anything else for an int is refused', () => {
    fc.assert(
      fc.property(fc.oneof(fc.integer().map(String), fc.string()), (word) => {
        const result = outcome(() => parseCommandArgs(command, ['text=x', `n=${word}`]));
        if (/^[+-]?\d+$/.test(word.trim()) && Number.isSafeInteger(Number(word))) {
          expect(result).toEqual({ ok: { text: 'x', n: Number(word), ratio: 0.5, flag: false } });
        } else {
          expect(result).toMatchObject({ problems: [expect.stringMatching(/^n: /)] });
        }
      }),
      { seed: SEED, numRuns: 500 },
    );
  });
});

describe('the wire contract under generated bodies', () => {
  let server: SandboxServer;
  let url: string;

  beforeAll(async () => {
    server = new SandboxServer({ port: 0, token: 'secret' });
    server.register('echo', (args) => args, command.args);
    url = `http://127.0.0.1:${(await server.start()).port}`;
  });

  afterAll(async () => {
    await server?.stop();
  });

  test('any body: a 200 with a result or a 4xx in the {error, type} shape, never a 5xx', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.uint8Array({ maxLength: 200 }).map((bytes) => Buffer.from(bytes)),
          kwargs.map((value) => Buffer.from(JSON.stringify(value))),
        ),
        async (body) => {
          const response = await request(`${url}/commands/echo`, {
            method: 'POST',
            headers: { authorization: 'Bearer secret', 'content-type': 'application/json' },
            body,
          });
          const answer = (await response.body.json()) as Record<string, unknown>;
          if (response.statusCode === 200) {
            expect(Object.keys(answer)).toEqual(['result']);
          } else {
            expect(response.statusCode).toBeGreaterThanOrEqual(400);
            expect(response.statusCode).toBeLessThan(500);
            expect(answer).toMatchObject({ error: expect.any(String), type: expect.any(String) });
          }
        },
      ),
      { seed: SEED, numRuns: 300 },
    );
  });
});

test('ArgumentError is what the client throws for bad kwargs', () => {
  expect(() => validateKwargs(command, { text: 1 })).toThrow(ArgumentError);
});
