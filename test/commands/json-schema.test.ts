import { Ajv } from 'ajv';
import { describe, expect, test } from 'vitest';
import {
  ArgumentError,
  type CustomCommand,
  parseTemplate,
  toJSONSchema,
  validateKwargs,
} from '../../src/index.js';

const [train] = parseTemplate(`name: t
custom_commands:
  train:
    description: Train a model
    command: train {epochs} {lr} {name} {verbose}
    args:
      - { name: epochs, type: int, description: passes over the data }
      - { name: lr, type: float, default: 0.01 }
      - { name: name, type: str, default: run }
      - { name: verbose, type: bool, default: false }
`).customCommands as [CustomCommand];

describe('toJSONSchema', () => {
  test('describes the kwargs as an object schema for LLM tools', () => {
    expect(toJSONSchema(train)).toEqual({
      type: 'object',
      description: 'Train a model',
      properties: {
        epochs: { type: 'integer', description: 'passes over the data' },
        lr: { type: 'number', default: 0.01 },
        name: { type: 'string', default: 'run' },
        verbose: { type: 'boolean', default: false },
      },
      required: ['epochs'],
      additionalProperties: false,
    });
  });

  test('a standard validator accepts and refuses the same kwargs as validateKwargs', () => {
    const validate = new Ajv({ strict: true }).compile(toJSONSchema(train));
    const samples: unknown[] = [
      { epochs: 3 },
      { epochs: 3, lr: 1, name: 'x', verbose: true },
      {},
      { epochs: 3.5 },
      { epochs: '3' },
      { epochs: 3, lr: '0.1' },
      { epochs: 3, verbose: 1 },
      { epochs: 3, extra: true },
      { epochs: null },
      { epochs: 3, name: 7 },
    ];
    for (const kwargs of samples) {
      let ours: boolean;
      try {
        validateKwargs(train, kwargs);
        ours = true;
      } catch (error) {
        expect(error).toBeInstanceOf(ArgumentError);
        ours = false;
      }
      expect({ kwargs, accepted: validate(kwargs) }).toEqual({ kwargs, accepted: ours });
    }
  });
});
