import { type ArgOptions, recordParameter } from './records.js';

type ParameterDecorator = (
  target: object,
  propertyKey: string | symbol | undefined,
  index: number,
) => void;

function parameterDecorator(decorator: string, options: ArgOptions): ParameterDecorator {
  return (target, propertyKey, index) =>
    recordParameter(target, { method: propertyKey, index, decorator, ...options });
}

/**
 * Declares a `number` parameter as an integer (`int`). TypeScript reflects every `number` as
 * `float`; this is how a command says it wants whole numbers.
 *
 * @example
 * summarize(path: string, @int top: number = 10) {}
 */
export const int: ParameterDecorator = parameterDecorator('@int', { type: 'int' });

/** Declares a `number` parameter as a float (the default for `number`; for explicitness). */
export const float: ParameterDecorator = parameterDecorator('@float', { type: 'float' });

/**
 * Says what reflection cannot: the argument's type (`str`, `int`, `float`, `bool`) and a
 * description shown in discovery, `--help` and LLM tool schemas.
 *
 * @example
 * train(@arg({ type: 'int', description: 'passes over the data' }) epochs: number) {}
 */
export function arg(options: ArgOptions): ParameterDecorator {
  return parameterDecorator('@arg', options);
}
