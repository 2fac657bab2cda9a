import '../src/reflect-metadata.js';
import type { ArgType } from '../src/commands/custom-command.js';
import { PARAMETER_OVERRIDES_KEY, REGISTERED_METHODS_KEY, SANDBOX_CLASS_KEY } from './constants.js';

/** Options of `@sandbox.register({ ... })`. */
export interface RegisterOptions {
  /** The command name; defaults to the method name. */
  name?: string;
  description?: string;
  /** How long one call may run before the server stops it with 504. */
  timeoutMs?: number;
}

/** Options of `@sandbox({ ... })` on a class. */
export interface SandboxOptions {
  /** The template whose sandboxes serve this class's commands. */
  template: string;
}

/** What `@sandbox(...)` records on a class. */
export interface ClassRecord extends SandboxOptions {
  /** The module file that defined the class, when the stack told it. */
  sourceFile?: string;
}

/** What `@arg({ ... })` can say about a parameter that reflection cannot. */
export interface ArgOptions {
  type?: ArgType;
  description?: string;
}

/** Raw record of `@sandbox.register`, written at decoration time and resolved by the builder. */
export interface MethodRecord {
  method: string | symbol;
  options: RegisterOptions;
  isStatic: boolean;
  hasDescriptor: boolean;
}

/** Raw record of `@int` / `@arg(...)` on one parameter. */
export interface ParameterRecord extends ArgOptions {
  method: string | symbol | undefined;
  index: number;
  /** How the user wrote it, for error messages: `@int`, `@arg`. */
  decorator: string;
}

/** The class a decorator target belongs to: a prototype for instance members, else the class. */
function classOf(target: object): object {
  return typeof target === 'function' ? target : target.constructor;
}

function append<T>(key: string, cls: object, record: T): void {
  const own: T[] = Reflect.getOwnMetadata(key, cls) ?? [];
  Reflect.defineMetadata(key, [...own, record], cls);
}

export function recordMethod(target: object, record: MethodRecord): void {
  append(REGISTERED_METHODS_KEY, classOf(target), record);
}

export function recordParameter(target: object, record: ParameterRecord): void {
  append(PARAMETER_OVERRIDES_KEY, classOf(target), record);
}

export function recordClass(cls: object, record: ClassRecord): void {
  Reflect.defineMetadata(SANDBOX_CLASS_KEY, record, cls);
}

/** The `@sandbox(...)` record of a class, if it has one. */
export function readClassRecord(cls: object): ClassRecord | undefined {
  return Reflect.getOwnMetadata(SANDBOX_CLASS_KEY, cls);
}

/** A record together with the class whose body wrote it. */
export type Owned<T> = T & { owner: object };

function own<T>(key: string, owner: object): Owned<T>[] {
  const records: T[] = Reflect.getOwnMetadata(key, owner) ?? [];
  return records.map((record) => ({ ...record, owner }));
}

/**
 * Method and parameter records of a class and its ancestors, the class's own last, so that a
 * subclass re-registering a method wins.
 */
export function readMemberRecords(cls: object): {
  methods: Owned<MethodRecord>[];
  parameters: Owned<ParameterRecord>[];
} {
  const chain: object[] = [];
  for (let c: object | null = cls; c && c !== Function.prototype; c = Object.getPrototypeOf(c)) {
    chain.unshift(c);
  }
  return {
    methods: chain.flatMap((owner) => own<MethodRecord>(REGISTERED_METHODS_KEY, owner)),
    parameters: chain.flatMap((owner) => own<ParameterRecord>(PARAMETER_OVERRIDES_KEY, owner)),
  };
}
