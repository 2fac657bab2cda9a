import { execFileSync } from 'node:child_process';
import fc from 'fast-check';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { SandboxServer } from '../../runtime/server/server.js';
import { validateKwargs as serverValidate } from '../../runtime/server/validate.js';
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

/** The result, or the problems an ArgumentError lists (client: `.problems`, server: `.details`). */
function outcome(run: () => unknown): unknown {
  try {
    return { ok: run() };
  } catch (error) {
    const { problems, details } = error as {
      problems?: readonly string[];
      details?: { problems?: readonly string[] };
    };
    return { problems: problems ?? details?.problems ?? String(error) };
  }
}

describe('the client and the in-sandbox server validate kwargs alike', () => {
  test('same verdict, same typed result, same problems, for any JSON kwargs', () => {
    fc.assert(
      fc.property(kwargs, (value) => {
        const client = outcome(() => validateKwargs(command, value));
        const server = outcome(() => serverValidate(command.name, command.args, value));
        expect(server).toEqual(client);
      }),
      { seed: SEED, numRuns: 1000 },
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
