import { Container } from 'typedi';
import { buildCommands, type DecoratedCommand } from './command-builder.js';
import type { CustomCommand } from './custom-command.js';
import { DuplicateCommandError, templateNotFound } from './errors.js';
import { fromShipped, shippedCommands } from './shipped-commands.js';
import type { TemplateSpec } from './template.js';

/**
 * Every decorated class and loaded template this process knows, by template name. A typedi
 * service, reached with {@link commandRegistry}; tests start clean with `Container.reset()`.
 */
export class CommandRegistry {
  private readonly classes = new Map<DecoratedCommand['cls'], DecoratedCommand[]>();
  private readonly templates = new Map<string, TemplateSpec>();

  /**
   * Builds and records a class's commands; throws if the class defines them wrongly. Inside a
   * sandbox bundle the schemas built on the client are shipped along, and used as they are.
   */
  registerClass(cls: DecoratedCommand['cls']): DecoratedCommand[] {
    const shipped = shippedCommands();
    const commands = (shipped && fromShipped(cls, shipped)) || buildCommands(cls);
    this.classes.set(cls, commands);
    return commands;
  }

  /** Every class registered so far, in registration order. */
  registeredClasses(): DecoratedCommand['cls'][] {
    return [...this.classes.keys()];
  }

  /** Every decorated command of the given classes (all registered ones by default). */
  decoratedOf(classes?: readonly DecoratedCommand['cls'][]): DecoratedCommand[] {
    return (classes ?? [...this.classes.keys()]).flatMap((cls) => this.classes.get(cls) ?? []);
  }

  /** Makes a loaded template known by its name (a later load of the same name replaces it). */
  registerTemplate(template: TemplateSpec): void {
    this.templates.set(template.name, template);
  }

  /** Names of every template that has a loaded file or a decorated class. */
  templateNames(): string[] {
    const names = new Set(this.templates.keys());
    for (const commands of this.classes.values()) {
      for (const { command } of commands) names.add(command.template);
    }
    return [...names].sort();
  }

  /** The decorated commands of a template, in registration order. */
  decorated(template: string): DecoratedCommand[] {
    return [...this.classes.values()].flat().filter((d) => d.command.template === template);
  }

  /**
   * The YAML and decorated commands of a template, merged (YAML first, in file order). A name
   * defined twice is an error naming both places.
   */
  list(template: string | TemplateSpec): CustomCommand[] {
    const loaded = typeof template === 'string' ? this.templates.get(template) : template;
    const name = typeof template === 'string' ? template : template.name;
    const decorated = this.decorated(name);
    if (!loaded && decorated.length === 0) {
      throw templateNotFound(name, this.templateNames());
    }
    const places = new Map<string, string>();
    const merged: CustomCommand[] = [];
    const add = (command: CustomCommand, place: string) => {
      const earlier = places.get(command.name);
      if (earlier !== undefined)
        throw new DuplicateCommandError(name, command.name, [earlier, place]);
      places.set(command.name, place);
      merged.push(command);
    };
    for (const command of loaded?.customCommands ?? []) {
      add(command, loaded?.places[command.name] ?? `${name}: custom_commands.${command.name}`);
    }
    for (const { command, place } of decorated) add(command, place);
    return merged;
  }
}

/**
 * The service id is a string, not the class: a process can load both the ESM and the CJS build of
 * this package (one module `import`s it, another `require`s it), and each build has its own
 * `CommandRegistry` class. typedi itself is one CJS module either way, so a string id gives every
 * copy the same registry.
 */
export const COMMAND_REGISTRY_ID = 'agent-sandbox:command-registry';

/** The process-wide command registry. */
export function commandRegistry(): CommandRegistry {
  if (!Container.has(COMMAND_REGISTRY_ID)) {
    Container.set({ id: COMMAND_REGISTRY_ID, factory: () => new CommandRegistry() });
  }
  return Container.get<CommandRegistry>(COMMAND_REGISTRY_ID);
}
