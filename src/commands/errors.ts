/**
 * Errors of the command model, beside the protocol's: a {@link CommandDefinitionError} is a
 * mistake in how commands are *defined* (a decorator used wrongly, a bad `template.yaml`) and
 * surfaces when the class or template is loaded; a bad *request* (wrong kwargs) is an
 * `ArgumentError` and surfaces when a command is called.
 */
import { TemplateNotFoundError } from '../../runtime/protocol/errors.js';

export {
  ArgumentError,
  CommandDefinitionError,
  DuplicateCommandError,
  TemplateError,
  TemplateNotFoundError,
} from '../../runtime/protocol/errors.js';

/** No template of that name is loaded and no decorated class names it. */
export function templateNotFound(
  template: string,
  known: readonly string[],
): TemplateNotFoundError {
  return new TemplateNotFoundError(
    `unknown template '${template}'; ${
      known.length > 0
        ? `known templates: ${known.join(', ')}`
        : 'no template is loaded: call loadTemplate(path) or decorate a class with @sandbox(name)'
    }`,
    { details: { template } },
  );
}
