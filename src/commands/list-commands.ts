import { commandRegistry } from './command-registry.js';
import type { CustomCommand } from './custom-command.js';
import type { TemplateSpec } from './template.js';

/**
 * The custom commands of a template: its `custom_commands:` from `template.yaml` and the methods
 * of classes decorated with `@sandbox(name)`, merged. Pass a template name (known once its file
 * is loaded with `loadTemplate` or a class names it) or a loaded {@link TemplateSpec}.
 *
 * @throws DuplicateCommandError when a name is defined twice, naming both places.
 * @throws TemplateNotFoundError for a name nothing defines.
 */
export function listCommands(template: string | TemplateSpec): CustomCommand[] {
  return commandRegistry().list(template);
}
