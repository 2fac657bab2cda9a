import type { BaseSandbox } from './base-sandbox.js';
import { isHelperError, runHelper } from './helper.js';
import type { GlobOptions, GlobResult } from './types.js';

/** glob() returns at most this many files (and sets `truncated`). */
export const GLOB_MAX_RESULTS = 1000;
/** glob() stops walking after this long (and sets `truncated`). */
export const GLOB_TIME_BUDGET_MS = 20_000;

/** {@link BaseSandbox.glob}: matched on the sandbox side (programs/glob.ts, glob-match.ts). */
export async function globFiles(
  sandbox: BaseSandbox,
  pattern: string,
  options: GlobOptions = {},
): Promise<GlobResult> {
  const path = options.path ?? '.';
  const outcome = await runHelper(sandbox, 'glob', {
    pattern,
    path,
    maxResults: GLOB_MAX_RESULTS,
    budgetMs: GLOB_TIME_BUDGET_MS,
  });
  if (!outcome.ok) return { error: outcome.error, truncated: false };
  const answer = outcome.value;
  if (!isHelperError(answer)) return answer;
  switch (answer.error) {
    case 'invalid_pattern':
      return {
        error: `Pattern '${pattern}': invalid_pattern ('..' segments may not leave the search root)`,
        truncated: false,
      };
    case 'file_not_found':
      return { error: `Path '${path}' not found`, truncated: false };
    case 'not_a_directory':
      return { error: `Path '${path}' is not a directory`, truncated: false };
    case 'permission_denied':
      return { error: `Permission denied searching '${path}'`, truncated: false };
    default:
      return {
        error: `Error globbing in '${path}': ${answer.detail ?? answer.error}`,
        truncated: false,
      };
  }
}
