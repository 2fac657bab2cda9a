/**
 * Errors of the command model.
 *
 * Two families, kept apart on purpose: a {@link CommandDefinitionError} is a mistake in how
 * commands are *defined* (a decorator used wrongly, a bad `template.yaml`) and surfaces when the
 * class or template is loaded; an {@link ArgumentError} is a bad *request* (wrong kwargs) and
 * surfaces when a command is called.
 */

/** A command is defined wrongly: a misused decorator, a bad template, a name defined twice. */
export class CommandDefinitionError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'CommandDefinitionError';
  }
}

/** A `template.yaml` cannot be read, parsed or validated. `location` is `file:line:column`. */
export class TemplateError extends CommandDefinitionError {
  readonly location: string | undefined;

  constructor(message: string, location?: string, options?: ErrorOptions) {
    super(location ? `${location}: ${message}` : message, options);
    this.name = 'TemplateError';
    this.location = location;
  }
}

/** The same command name is defined in two places of one template. */
export class DuplicateCommandError extends CommandDefinitionError {
  readonly command: string;
  readonly places: [string, string];

  constructor(template: string, command: string, places: [string, string]) {
    super(
      `command '${command}' is defined twice in template '${template}': at ${places[0]} and at ${places[1]}; rename or remove one of them`,
    );
    this.name = 'DuplicateCommandError';
    this.command = command;
    this.places = places;
  }
}

/** No template of that name is loaded and no decorated class names it. */
export class TemplateNotFoundError extends CommandDefinitionError {
  readonly template: string;

  constructor(template: string, known: readonly string[]) {
    super(
      `unknown template '${template}'; ${
        known.length > 0
          ? `known templates: ${known.join(', ')}`
          : 'no template is loaded: call loadTemplate(path) or decorate a class with @sandbox(name)'
      }`,
    );
    this.name = 'TemplateNotFoundError';
    this.template = template;
  }
}

/** Problems listed in one ArgumentError; the rest are counted. Client and server agree. */
const MAX_PROBLEMS = 20;

/** The kwargs of a call do not fit the command's arguments. Every problem is listed. */
export class ArgumentError extends Error {
  readonly command: string;
  readonly problems: readonly string[];
  readonly usage: string;

  constructor(command: string, all: readonly string[], usage: string) {
    // A hostile body with thousands of unknown names gets a short answer, not one line per name.
    const problems =
      all.length > MAX_PROBLEMS
        ? [...all.slice(0, MAX_PROBLEMS), `and ${all.length - MAX_PROBLEMS} more problems`]
        : all;
    super(`invalid arguments for '${command}': ${problems.join('; ')}. Usage: ${usage}`);
    this.name = 'ArgumentError';
    this.command = command;
    this.problems = problems;
    this.usage = usage;
  }
}
