import { CommandExitError, type CommandResult } from './errors.js';
import type { HttpClient } from './http-client.js';

/** Options of {@link Commands.run}. */
export interface RunOptions {
  /** Working directory; default the template's workdir. */
  cwd?: string;
  /** Extra environment variables for this command. */
  envs?: Record<string, string>;
  /** Kills the command's whole process group after this; default 60 s. */
  timeoutMs?: number;
  /** Resolve with the result instead of throwing {@link CommandExitError} on a non-zero exit. */
  allowNonZeroExit?: boolean;
}

/** The default timeout of a command: 60 s. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;

interface ExecAnswer {
  stdout: string;
  stderr: string;
  exit_code: number;
}

/** Shell commands in a sandbox, through its envd. */
export class Commands {
  constructor(private readonly envd: HttpClient) {}

  /**
   * Runs a shell command to completion: `{ stdout, stderr, exitCode }`. A non-zero exit throws
   * {@link CommandExitError} carrying the result (unless `allowNonZeroExit`); a timeout kills
   * the command's process group and throws {@link TimeoutError} with the output captured so far.
   */
  async run(command: string, options: RunOptions = {}): Promise<CommandResult> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    const answer = await this.envd.json<ExecAnswer>('POST', '/process/exec', {
      body: {
        cmd: command,
        ...(options.cwd ? { cwd: options.cwd } : {}),
        ...(options.envs ? { env: options.envs } : {}),
        timeout: timeoutMs / 1000,
      },
      // The envd stops the command at its timeout; the HTTP deadline is a backstop behind it.
      timeoutMs: timeoutMs + 10_000,
    });
    const result: CommandResult = {
      stdout: answer.stdout,
      stderr: answer.stderr,
      exitCode: answer.exit_code,
    };
    if (result.exitCode !== 0 && !options.allowNonZeroExit) throw new CommandExitError(result);
    return result;
  }
}
