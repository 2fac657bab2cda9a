import type { BaseSandbox } from './base-sandbox.js';
import { isHelperError, runHelper } from './helper.js';
import type { GrepOptions, GrepResult } from './types.js';

/** {@link BaseSandbox.grep}: a literal substring search on the sandbox side (programs/grep.ts). */
export async function grepFiles(
  sandbox: BaseSandbox,
  pattern: string,
  options: GrepOptions = {},
): Promise<GrepResult> {
  const path = options.path ?? '.';
  const maxCount =
    options.maxCount === undefined ? null : Math.max(0, Math.floor(Number(options.maxCount) || 0));
  const outcome = await runHelper(sandbox, 'grep', {
    pattern,
    path,
    glob: options.glob ?? null,
    maxCount,
  });
  if (!outcome.ok) return { error: outcome.error, truncated: false };
  const answer = outcome.value;
  if (!isHelperError(answer)) return answer;
  switch (answer.error) {
    case 'file_not_found':
      return { error: `Path '${path}' not found`, truncated: false };
    case 'permission_denied':
      return { error: `Permission denied searching '${path}'`, truncated: false };
    case 'invalid_pattern':
      return {
        error: `Glob '${options.glob}': invalid_pattern ('..' segments may not leave the search root)`,
        truncated: false,
      };
    default:
      return {
        error: `Error searching '${path}': ${answer.detail ?? answer.error}`,
        truncated: false,
      };
  }
}
