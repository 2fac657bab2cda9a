import '../reflect-metadata.js';
import { plainToInstance, Type } from 'class-transformer';
import {
  ArrayUnique,
  IsArray,
  IsBoolean,
  IsIn,
  IsInt,
  IsNotEmpty,
  IsOptional,
  IsString,
  Matches,
  Min,
  NotEquals,
  registerDecorator,
  ValidateIf,
  ValidateNested,
  type ValidationArguments,
  type ValidationError,
  validateSync,
} from 'class-validator';

import {
  ARG_TYPES,
  type ArgType,
  type ArgValue,
  COMMAND_NAME_PATTERN,
  ENV_NAME_PATTERN,
  fitsType,
} from '../../runtime/protocol/arguments.js';

export {
  ARG_TYPES,
  type ArgType,
  type ArgValue,
  fitsType,
  type Kwargs,
} from '../../runtime/protocol/arguments.js';

/** Where a command was defined. */
export type CommandSource = 'yaml' | 'decorator';

/** Names the command server serves itself; a custom command cannot take them. */
export const BUILTIN_COMMANDS = ['upload', 'download', 'runshell'] as const;

/** Command names travel in URL paths and CLI words; argument names become shell variables. */
export const ARG_NAME_PATTERN = ENV_NAME_PATTERN;
export { COMMAND_NAME_PATTERN };

function DefaultFitsType() {
  return (object: object, propertyName: string) =>
    registerDecorator({
      name: 'defaultFitsType',
      target: object.constructor,
      propertyName,
      validator: {
        validate: (value: unknown, args: ValidationArguments) => {
          const type = (args.object as CustomCommandArg).type;
          return !ARG_TYPES.includes(type) || fitsType(type, value);
        },
        defaultMessage: (args: ValidationArguments) =>
          `${JSON.stringify(args.value)} is not a valid ${(args.object as CustomCommandArg).type}`,
      },
    });
}

function RequiredMatchesDefault() {
  return (object: object, propertyName: string) =>
    registerDecorator({
      name: 'requiredMatchesDefault',
      target: object.constructor,
      propertyName,
      validator: {
        validate: (required: unknown, args: ValidationArguments) =>
          !(required === true && (args.object as CustomCommandArg).default !== undefined),
        defaultMessage: () => 'an argument with a default cannot be required',
      },
    });
}

/** One argument of a {@link CustomCommand}. */
export class CustomCommandArg {
  @IsString({ message: 'must be a string' })
  @Matches(ARG_NAME_PATTERN, {
    message: 'must be an identifier (letters, digits and _, not starting with a digit)',
  })
  name!: string;

  @IsIn(ARG_TYPES, { message: `must be one of ${ARG_TYPES.join(', ')}` })
  type!: ArgType;

  /** True when the argument has no default and must be given. */
  @IsBoolean({ message: 'must be true or false' })
  @RequiredMatchesDefault()
  required!: boolean;

  @IsOptional()
  @DefaultFitsType()
  default?: ArgValue;

  @IsOptional()
  @IsString({ message: 'must be a string' })
  description?: string;
}

/**
 * A command that runs inside a sandbox. One model whatever its source: a `custom_commands:` entry
 * of a `template.yaml` (`source: 'yaml'`, runs `command` in a shell) or a method decorated with
 * `@sandbox.register` (`source: 'decorator'`, served by the command server).
 */
export class CustomCommand {
  @IsString({ message: 'must be a string' })
  @Matches(COMMAND_NAME_PATTERN, {
    message: 'must start with a letter or _ and contain only letters, digits, _ and -',
  })
  @NotEquals(BUILTIN_COMMANDS[0], { message: 'is a built-in command of the server' })
  @NotEquals(BUILTIN_COMMANDS[1], { message: 'is a built-in command of the server' })
  @NotEquals(BUILTIN_COMMANDS[2], { message: 'is a built-in command of the server' })
  name!: string;

  @IsString({ message: 'must be a string' })
  description!: string;

  @IsArray({ message: 'must be a list' })
  @ArrayUnique((arg: CustomCommandArg) => arg?.name, { message: 'names an argument twice' })
  @ValidateNested()
  @Type(() => CustomCommandArg)
  args!: CustomCommandArg[];

  /** The template the command belongs to. */
  @IsString({ message: 'must be a string' })
  @IsNotEmpty({ message: 'must not be empty' })
  template!: string;

  @IsIn(['yaml', 'decorator'], { message: 'must be yaml or decorator' })
  source!: CommandSource;

  /** The shell template of a YAML command, with `{arg}` placeholders. */
  @ValidateIf(
    (command: CustomCommand) => command.source === 'yaml' || command.command !== undefined,
  )
  @IsString({ message: 'must be a string' })
  @IsNotEmpty({ message: 'must not be empty' })
  command?: string;

  /** How long one call may run before it is stopped. */
  @IsOptional()
  @IsInt({ message: 'must be a whole number of milliseconds' })
  @Min(1, { message: 'must be positive' })
  timeoutMs?: number;
}

/** One problem found by {@link validateCommand}: `path` is like `args[0].type`. */
export interface ModelIssue {
  path: string;
  message: string;
}

function collectIssues(errors: ValidationError[], prefix: string, into: ModelIssue[]): void {
  for (const error of errors) {
    const path = /^\d+$/.test(error.property)
      ? `${prefix}[${error.property}]`
      : prefix
        ? `${prefix}.${error.property}`
        : error.property;
    for (const message of Object.values(error.constraints ?? {})) into.push({ path, message });
    collectIssues(error.children ?? [], path, into);
  }
}

/**
 * Turns a plain object into a validated {@link CustomCommand}. Returns the problems instead when
 * it is not valid, so each caller can say *where* (a YAML key, a decorated parameter).
 */
export function validateCommand(
  plain: Record<string, unknown>,
): { command: CustomCommand; issues: [] } | { command: undefined; issues: ModelIssue[] } {
  const command = plainToInstance(CustomCommand, plain);
  const errors = validateSync(command, {
    whitelist: true,
    forbidNonWhitelisted: true,
    forbidUnknownValues: true,
  });
  if (errors.length === 0) return { command, issues: [] };
  const issues: ModelIssue[] = [];
  collectIssues(errors, '', issues);
  return { command: undefined, issues };
}

/** Template names appear in file names, registry rows and host names. */
export const TEMPLATE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
