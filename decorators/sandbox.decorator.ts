import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { commandRegistry } from '../src/commands/command-registry.js';
import { DEFAULT_TEMPLATE } from './constants.js';
import { type RegisterOptions, recordClass, recordMethod, type SandboxOptions } from './records.js';
import { callerFile } from './source-file.js';

type Class = abstract new (...args: never[]) => unknown;
type ClassDecorator = <T extends Class>(cls: T) => T;
type MethodDecorator = (
  target: object,
  propertyKey: string | symbol,
  descriptor?: PropertyDescriptor,
) => void;

/** This package's own code, skipped when looking for the module that applies a decorator. */
function ownDirs(): string[] {
  try {
    return [`${dirname(fileURLToPath(import.meta.url))}/`];
  } catch {
    // A bundle without import.meta (CommonJS inside a sandbox): nothing to skip there.
    return [];
  }
}

function classDecorator(options: SandboxOptions): ClassDecorator {
  return (cls) => {
    const sourceFile = callerFile(ownDirs());
    recordClass(cls, { ...options, ...(sourceFile ? { sourceFile } : {}) });
    commandRegistry().registerClass(cls);
    return cls;
  };
}

function methodDecorator(options: RegisterOptions): MethodDecorator {
  return (target, propertyKey, descriptor) =>
    recordMethod(target, {
      method: propertyKey,
      options,
      isStatic: typeof target === 'function',
      hasDescriptor: descriptor !== undefined,
    });
}

/** Bare `@sandbox.register` is called with (target, key, descriptor); the factory form is not. */
function isDecoratorCall(args: unknown[]): args is [object, string | symbol, PropertyDescriptor?] {
  return (
    args.length >= 2 &&
    (typeof args[0] === 'object' || typeof args[0] === 'function') &&
    (typeof args[1] === 'string' || typeof args[1] === 'symbol')
  );
}

/** `@sandbox.register` and `@sandbox.register({ name, description, timeoutMs })`. */
function register(options?: RegisterOptions): MethodDecorator;
function register(
  target: object,
  propertyKey: string | symbol,
  descriptor?: PropertyDescriptor,
): void;
function register(...args: unknown[]): MethodDecorator | undefined {
  if (isDecoratorCall(args)) {
    methodDecorator({})(...args);
    return undefined;
  }
  return methodDecorator((args[0] as RegisterOptions | undefined) ?? {});
}

/** The `sandbox` decorator factory: call it on a class, use `.register` on its methods. */
export interface SandboxDecorator {
  /** `@sandbox('tpl')`: the class's registered methods are commands of template `tpl`. */
  (template: string): ClassDecorator;
  /** `@sandbox({ template: 'tpl' })`. */
  (options: SandboxOptions): ClassDecorator;
  /** `@sandbox` bare: the commands belong to the `base` template. */
  <T extends Class>(cls: T): T;
  /**
   * Registers a method as a command. The command's arguments are the method's parameters:
   * names and literal defaults come from its source, types from TypeScript's metadata
   * (`string` → str, `number` → float, `boolean` → bool; `@int` for integers).
   */
  register: typeof register;
}

function sandboxFactory(target: string | SandboxOptions | Class): unknown {
  if (typeof target === 'function') return classDecorator({ template: DEFAULT_TEMPLATE })(target);
  return classDecorator(typeof target === 'string' ? { template: target } : target);
}

/**
 * Marks a class whose methods run as commands inside sandboxes of a template.
 *
 * @example
 * \@sandbox('data-tools')
 * class DataTools {
 *   \@sandbox.register
 *   summarize(path: string, \@int top: number = 10) { ... }
 * }
 */
export const sandbox: SandboxDecorator = Object.assign(sandboxFactory, {
  register,
}) as SandboxDecorator;
