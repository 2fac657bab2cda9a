import { CommandDefinitionError } from '../commands/errors.js';
import type { BaseSandbox } from './base-sandbox.js';
import { type CommandHost, commandToolSpecs } from './command-tools.js';
import { FILE_TOOLS } from './file-tools.js';
import { toToolCallError } from './tool-error.js';
import { validateToolArgs } from './tool-schema.js';
import { FILE_TOOL_NAMES, type FileToolName, type SandboxTool, toJsonValue } from './tool-types.js';

/** Options of {@link sandboxTools}. */
export interface SandboxToolsOptions {
  /** Which file tools to include: `true` (default) for all, `false` for none, or a list. */
  fileTools?: boolean | readonly FileToolName[];
  /** Include the sandbox's custom commands (default true when the sandbox has any). */
  commands?: boolean;
}

function selectedFileTools(option: SandboxToolsOptions['fileTools']): readonly FileToolName[] {
  if (option === undefined || option === true) return FILE_TOOL_NAMES;
  return option === false ? [] : option;
}

function hasCommands(sandbox: object): sandbox is CommandHost {
  const host = sandbox as Partial<CommandHost>;
  return typeof host.listCommands === 'function' && typeof host.run === 'function';
}

/**
 * The tools a model can call on one sandbox: one per custom command (YAML and decorated, as
 * `listCommands` gives them; decorated ones only while the command server runs) and the file
 * tools `ls`, `read_file`, `write_file`, `edit_file`, `glob`, `grep`, `execute`. Any
 * {@link BaseSandbox} gets the file tools; a `Sandbox` also gets its custom commands.
 *
 * Each tool's `invoke(args)` validates the arguments (strict JSON types, every problem at once),
 * runs the tool in the sandbox and resolves with plain JSON. **Errors are thrown, never returned**:
 * `invoke` rejects with a `ToolCallError` whose `type` says what failed (`ArgumentError`,
 * `FileOperationError`, or the remote error class). A shell command's non-zero exit (`execute`,
 * YAML commands) is a result with its `exitCode`, not an error.
 *
 * The list is a snapshot: call again after starting the command server to see its commands.
 *
 * @example
 * const tools = await sandboxTools(sandbox); // or: await sandbox.tools()
 * const shout = tools.find((t) => t.name === 'shout');
 * await shout?.invoke({ text: 'hi' }); // { stdout: 'HI', stderr: '', exitCode: 0 }
 */
export async function sandboxTools(
  sandbox: BaseSandbox,
  options: SandboxToolsOptions = {},
): Promise<SandboxTool[]> {
  const files = selectedFileTools(options.fileTools);
  const tools: SandboxTool[] = [];
  if (options.commands !== false && hasCommands(sandbox)) {
    for (const spec of await commandToolSpecs(sandbox)) {
      if ((files as readonly string[]).includes(spec.name)) {
        throw new CommandDefinitionError(
          `custom command '${spec.name}' has the name of a file tool; rename the command or leave the file tool out with sandboxTools(sandbox, { fileTools: [...] })`,
        );
      }
      tools.push({
        name: spec.name,
        description: spec.description,
        parameters: spec.parameters,
        kind: 'command',
        invoke: async (args) => {
          try {
            return toJsonValue(await spec.run(args));
          } catch (error) {
            throw toToolCallError(spec.name, error);
          }
        },
      });
    }
  }
  for (const spec of FILE_TOOLS.filter((s) => files.includes(s.name))) {
    tools.push({
      name: spec.name,
      description: spec.description,
      parameters: spec.parameters,
      kind: 'file',
      invoke: async (args) => {
        try {
          return toJsonValue(
            await spec.run(sandbox, validateToolArgs(spec.name, spec.parameters, args)),
          );
        } catch (error) {
          throw toToolCallError(spec.name, error);
        }
      },
    });
  }
  return tools;
}
