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
  /**
   * Include `run_code` (stateful Python, JavaScript or bash cells): default true on a `Sandbox`
   * whose template has the `code` capability.
   */
  code?: boolean;
}

/** What `run_code` needs: a sandbox that runs code cells (a `Sandbox`). */
interface CodeHost {
  runCode(
    code: string,
    options?: { language?: 'python' | 'javascript' | 'bash'; timeoutMs?: number },
  ): Promise<{
    results: { isMainResult: boolean; formats(): string[] }[];
    logs: { stdout: string[]; stderr: string[] };
    error?: { name: string; value: string; traceback: string };
    executionCount?: number;
  }>;
}

function runsCode(sandbox: object): sandbox is CodeHost {
  return typeof (sandbox as Partial<CodeHost>).runCode === 'function';
}

/** True when the sandbox's template has the `code` capability (a sandbox that cannot say: yes). */
async function hasCodeCapability(sandbox: object): Promise<boolean> {
  const info = (sandbox as { getInfo?: () => Promise<{ capabilities?: string[] }> }).getInfo;
  if (typeof info !== 'function') return true;
  const { capabilities } = await info.call(sandbox);
  return capabilities?.includes('code') ?? true;
}

/** The run_code tool's arguments. */
const RUN_CODE_PARAMETERS = {
  type: 'object',
  properties: {
    code: { type: 'string', description: 'the code of one cell' },
    language: {
      type: 'string',
      description: 'python (default), javascript or bash',
      enum: ['python', 'javascript', 'bash'],
    },
  },
  required: ['code'],
  additionalProperties: false,
} as const;

/**
 * `run_code`: one cell in the sandbox's default context of its language; state persists from
 * call to call. Resolves with the output, the results (each format it has; images as base64) and
 * the error the code raised, if any — an exception in the code is a result the model reads, not
 * a failed tool call.
 */
function runCodeTool(sandbox: CodeHost): SandboxTool {
  return {
    name: 'run_code',
    description:
      'Run code in a stateful interpreter in the sandbox (variables and imports persist between calls). The value of the last expression comes back as a result; charts (matplotlib) as PNG images.',
    parameters: RUN_CODE_PARAMETERS as unknown as SandboxTool['parameters'],
    kind: 'code',
    invoke: async (args) => {
      try {
        const { code, language } = validateToolArgs(
          'run_code',
          RUN_CODE_PARAMETERS as unknown as SandboxTool['parameters'],
          args,
        ) as { code: string; language?: 'python' | 'javascript' | 'bash' };
        const execution = await sandbox.runCode(code, language ? { language } : {});
        return toJsonValue({
          stdout: execution.logs.stdout.join(''),
          stderr: execution.logs.stderr.join(''),
          results: execution.results.map((result) => {
            const formats: Record<string, unknown> = { isMainResult: result.isMainResult };
            for (const format of result.formats()) {
              formats[format] = (result as unknown as Record<string, unknown>)[format];
            }
            return formats;
          }),
          error: execution.error ?? null,
          executionCount: execution.executionCount ?? null,
        });
      } catch (error) {
        throw toToolCallError('run_code', error);
      }
    },
  };
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
  if (options.code !== false && runsCode(sandbox) && (await hasCodeCapability(sandbox))) {
    tools.push(runCodeTool(sandbox));
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
