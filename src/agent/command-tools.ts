import { validateKwargs } from '../commands/arguments.js';
import type { CommandSource, CustomCommand } from '../commands/custom-command.js';
import type { CommandDescription } from '../commands/discovery.js';
import { toJSONSchema } from '../commands/json-schema.js';
import type { ToolParameters } from './tool-schema.js';

/** What a sandbox needs to offer its custom commands as tools (a `Sandbox` has it). */
export interface CommandHost {
  /** The sandbox's custom commands: YAML ones of its template and decorated ones it serves. */
  listCommands(): Promise<(CommandDescription & { source: CommandSource })[]>;
  /** Runs a custom command by name. */
  run(name: string, kwargs?: Record<string, unknown>): Promise<unknown>;
}

/** A custom command before it is bound into a tool. */
export interface CommandToolSpec {
  name: string;
  description: string;
  parameters: ToolParameters;
  run(args: unknown): Promise<unknown>;
}

/**
 * One tool spec per custom command. The schema and the validation are the command model's own
 * (`toJSONSchema`, `validateKwargs`), so a tool accepts exactly what `sandbox.run` accepts.
 */
export async function commandToolSpecs(host: CommandHost): Promise<CommandToolSpec[]> {
  return (await host.listCommands()).map((description) => {
    // The discovery shape carries everything the schema and validation read; `template` is only
    // needed by the class, not by them.
    const command: CustomCommand = { ...description, template: '' };
    const { description: _, ...parameters } = toJSONSchema(command);
    return {
      name: command.name,
      description:
        command.description ||
        `Run the custom command ${command.name} (${command.source}) in the sandbox.`,
      parameters,
      run: (args) => host.run(command.name, validateKwargs(command, args)),
    };
  });
}
