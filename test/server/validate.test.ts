import { describe, expect, test } from 'vitest';
import { type ArgSpec, validateKwargs as serverValidate } from '../../runtime/server/validate.js';
import { ArgumentError, CustomCommand, CustomCommandArg, validateKwargs } from '../../src/index.js';

// runtime/ cannot import src/, so the server re-implements the client's strict JSON rules;
// these cases pin the two to the same answers, message for message.
const ARGS: ArgSpec[] = [
  { name: 'path', type: 'str', required: true },
  { name: 'top', type: 'int', required: false, default: 10 },
  { name: 'ratio', type: 'float', required: false, default: 0.5 },
  { name: 'verbose', type: 'bool', required: false, default: false },
  { name: 'label', type: 'str', required: false, description: 'no default' },
];

function clientCommand(): CustomCommand {
  const command = Object.assign(new CustomCommand(), {
    name: 'summarize',
    description: '',
    template: 't',
    source: 'decorator',
    args: ARGS.map((arg) => Object.assign(new CustomCommandArg(), arg)),
  });
  return command;
}

function outcome(run: () => unknown) {
  try {
    return { ok: run() };
  } catch (error) {
    const e = error as {
      name: string;
      message: string;
      problems?: readonly string[];
      details?: { problems?: readonly string[] };
    };
    return { name: e.name, message: e.message, problems: e.problems ?? e.details?.problems };
  }
}

describe('server kwargs validation agrees with the client parser', () => {
  test.each<[string, unknown]>([
    ['all defaults', { path: 'a' }],
    ['every type right', { path: 'a', top: 3, ratio: 2, verbose: true, label: 'x' }],
    ['float given an int', { path: 'a', ratio: 4 }],
    ['int given a float', { path: 'a', top: 1.5 }],
    ['int past safe range', { path: 'a', top: 2 ** 53 }],
    ['string for int', { path: 'a', top: '3' }],
    ['number for bool', { path: 'a', verbose: 1 }],
    ['null value', { path: null }],
    ['infinite float', { path: 'a', ratio: Number.POSITIVE_INFINITY }],
    ['object value', { path: { x: 1 } }],
    ['array value', { path: ['a'] }],
    ['missing required', {}],
    ['unknown close name', { path: 'a', verbos: true }],
    ['unknown far name', { path: 'a', zzzzzzzz: 1 }],
    ['everything wrong', { top: 'x', verbose: 'yes', pth: 'a', extra: 1 }],
    ['not an object: array', [1]],
    ['not an object: string', 'path=a'],
    ['not an object: null', null],
    ['undefined body', undefined],
  ])('%s', (_, kwargs) => {
    const client = outcome(() => validateKwargs(clientCommand(), kwargs));
    const server = outcome(() => serverValidate('summarize', ARGS, kwargs));
    expect(server).toEqual(client);
  });

  test('the client error is an ArgumentError like the server one', () => {
    expect(() => validateKwargs(clientCommand(), {})).toThrow(ArgumentError);
  });
});
