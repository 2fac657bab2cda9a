import { DESIGN_PARAMTYPES_KEY } from '../../decorators/constants.js';
import {
  type MethodRecord,
  type Owned,
  type ParameterRecord,
  readClassRecord,
  readMemberRecords,
} from '../../decorators/records.js';
import {
  type ArgType,
  type ArgValue,
  type CustomCommand,
  fitsType,
  TEMPLATE_NAME_PATTERN,
  validateCommand,
} from './custom-command.js';
import { CommandDefinitionError } from './errors.js';
import { type ParsedParameter, parseParameters } from './parameters.js';

/** A command built from a decorated method, with what it takes to call it. */
export interface DecoratedCommand {
  command: CustomCommand;
  /** The decorated class; the server calls `method` on one instance of it. */
  cls: abstract new (
    ...args: never[]
  ) => unknown;
  method: string;
  /** `Class.method`, for messages that must say where a command comes from. */
  place: string;
}

type AnyClass = DecoratedCommand['cls'];

const REFLECTED_TYPES = new Map<unknown, ArgType>([
  [String, 'str'],
  [Number, 'float'],
  [Boolean, 'bool'],
]);

const TYPE_WORDS: Record<ArgType, string> = {
  str: 'string',
  int: 'number',
  float: 'number',
  bool: 'boolean',
};

function typeOfLiteral(value: ArgValue): ArgType {
  if (typeof value === 'string') return 'str';
  if (typeof value === 'boolean') return 'bool';
  return Number.isInteger(value) ? 'int' : 'float';
}

function fixForDefault(type: ArgType): string {
  switch (type) {
    case 'int':
      return 'write a whole number, or declare the parameter with @float';
    case 'float':
      return 'write a number';
    case 'str':
      return 'write a string literal';
    case 'bool':
      return 'write true or false';
  }
}

/**
 * Turns the records that `@sandbox` / `@sandbox.register` / `@int` / `@arg` left on a class into
 * validated commands. The only place where decorator misuse is detected; it reports every
 * problem of the class at once, each naming `Class.method(param)` and what to write instead.
 */
export function buildCommands(cls: AnyClass): DecoratedCommand[] {
  const className = cls.name || '(anonymous class)';
  const problems: string[] = [];
  const template = readClassRecord(cls)?.template;
  if (typeof template !== 'string' || !TEMPLATE_NAME_PATTERN.test(template)) {
    problems.push(
      `${className}: @sandbox(${JSON.stringify(template)}) needs a template name of letters, digits, '.', '_' and '-', such as @sandbox('data-tools')`,
    );
  }
  const { methods, parameters } = readMemberRecords(cls);
  const effective = new Map<string | symbol, Owned<MethodRecord>>();
  for (const record of methods) effective.set(record.method, record);
  if (effective.size === 0) {
    problems.push(
      `${className} is decorated with @sandbox but registers no command; add @sandbox.register to the methods it should serve`,
    );
  }
  for (const record of parameters) {
    const method = record.method === undefined ? undefined : effective.get(record.method);
    if (method?.owner === record.owner) continue;
    const where =
      record.method === undefined
        ? `a constructor parameter of ${className}`
        : `${className}.${String(record.method)}(parameter ${record.index + 1})`;
    problems.push(
      `${record.decorator} on ${where} has no effect: only parameters of methods decorated with @sandbox.register become command arguments`,
    );
  }

  const built: DecoratedCommand[] = [];
  for (const record of effective.values()) {
    const own = parameters.filter((p) => p.owner === record.owner && p.method === record.method);
    const result = buildOne(cls, className, template ?? '', record, own);
    if (Array.isArray(result)) problems.push(...result);
    else built.push(result);
  }
  if (problems.length > 0) {
    throw new CommandDefinitionError(
      problems.length === 1
        ? problems[0]
        : `${className} defines its commands wrongly:\n  - ${problems.join('\n  - ')}`,
    );
  }
  return built;
}

function buildOne(
  cls: AnyClass,
  className: string,
  template: string,
  record: Owned<MethodRecord>,
  overrides: Owned<ParameterRecord>[],
): DecoratedCommand | string[] {
  const where = `${className}.${String(record.method)}`;
  if (typeof record.method === 'symbol') {
    return [`${where}: a symbol-named method cannot be a command; give it a string name`];
  }
  if (record.isStatic) {
    return [
      `${where}: @sandbox.register is on a static method; make it an instance method (the server calls it on one instance of ${className})`,
    ];
  }
  const fn = (cls.prototype as Record<string, unknown>)[record.method];
  if (!record.hasDescriptor || typeof fn !== 'function') {
    return [`${where}: @sandbox.register goes on a method, not on a property or accessor`];
  }
  let parsed: ParsedParameter[];
  try {
    parsed = parseParameters(fn as () => unknown);
  } catch (error) {
    return [`${where}: cannot read the parameters: ${(error as Error).message}`];
  }
  const reflected: unknown[] | undefined = Reflect.getMetadata(
    DESIGN_PARAMTYPES_KEY,
    cls.prototype,
    record.method,
  );
  const problems: string[] = [];
  const args: Record<string, unknown>[] = [];
  parsed.forEach((param, index) => {
    const arg = buildArg(param, reflected, index, overrides, `${where}`);
    if (typeof arg === 'string') problems.push(arg);
    else args.push(arg);
  });
  if (problems.length > 0) return problems;

  const { options } = record;
  const { command, issues } = validateCommand({
    name: options.name ?? record.method,
    description: options.description ?? '',
    args,
    template,
    source: 'decorator',
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
  });
  if (!command) {
    return issues.map(({ path, message }) => {
      const argIndex = /^args\[(\d+)\]/.exec(path)?.[1];
      if (argIndex !== undefined) {
        const name = args[Number(argIndex)]?.name;
        return `${where}(${String(name)}): ${path.replace(/^args\[\d+\]\.?/, '') || 'argument'} ${message}`;
      }
      if (path === 'name') {
        return `${where}: command name ${JSON.stringify(options.name ?? record.method)} ${message}; pass another with @sandbox.register({ name: '...' })`;
      }
      return `${where}: ${path} ${message}`;
    });
  }
  return { command, cls, method: record.method, place: where };
}

function buildArg(
  param: ParsedParameter,
  reflected: unknown[] | undefined,
  index: number,
  overrides: ParameterRecord[],
  where: string,
): Record<string, unknown> | string {
  if (param.kind === 'destructured') {
    return `${where}(${param.text}): a destructured parameter cannot be a command argument; take one named parameter per argument`;
  }
  if (param.kind === 'rest') {
    return `${where}(${param.text}): a rest parameter cannot be a command argument; take one named parameter per argument`;
  }
  const at = `${where}(${param.name})`;
  const mine = overrides.filter((o) => o.index === index);
  const declared = mine.filter((o) => o.type !== undefined);
  if (new Set(declared.map((o) => o.type)).size > 1) {
    return `${at}: ${declared.map((o) => `${o.decorator} says ${o.type}`).join(' but ')}; keep one`;
  }
  const override = declared[0];
  const description = mine.find((o) => o.description !== undefined)?.description;

  const runtimeType = reflected?.[index];
  const reflectedType = REFLECTED_TYPES.get(runtimeType);
  const unknownType = runtimeType === undefined || runtimeType === Object;
  if (!reflectedType && !unknownType) {
    const typeName = (runtimeType as { name?: string })?.name || String(runtimeType);
    return `${at}: type ${typeName} is not supported; declare it as string, number (with @int for integers) or boolean`;
  }
  if (param.default && !param.default.literal) {
    return `${at}: default \`${param.default.text}\` is not a literal; write a string, number or boolean literal, or no default to make the argument required`;
  }
  const defaultValue = param.default?.value;

  let type: ArgType | undefined;
  if (override?.type) {
    if (reflectedType && TYPE_WORDS[reflectedType] !== TYPE_WORDS[override.type]) {
      return `${at}: ${override.decorator} makes it ${override.type} but it is declared ${TYPE_WORDS[reflectedType]}; declare it as ${TYPE_WORDS[override.type]}`;
    }
    type = override.type;
  } else if (reflectedType) {
    type = reflectedType;
  } else if (defaultValue !== undefined) {
    type = typeOfLiteral(defaultValue);
  } else {
    const hint =
      reflected === undefined
        ? ' (no type metadata was emitted: compile with "emitDecoratorMetadata": true)'
        : ' (any, unknown, object, a union or a missing annotation all look alike at run time)';
    return `${at}: its type cannot be read${hint}; declare it as string, number or boolean, or add @arg({ type: 'str' })`;
  }
  if (defaultValue !== undefined && !fitsType(type, defaultValue)) {
    return `${at}: default ${JSON.stringify(defaultValue)} is not a valid ${type}; ${fixForDefault(type)}`;
  }
  return {
    name: param.name,
    type,
    required: defaultValue === undefined,
    ...(defaultValue === undefined ? {} : { default: defaultValue }),
    ...(description === undefined ? {} : { description }),
  };
}
