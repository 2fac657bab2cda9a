import { GLOB_STYLES } from '../../runtime/server/file-tools/protocol.js';
import { timeBudget } from './grep.js';
import { isToolError, type ToolRunner } from './tool-runner.js';
import type { GlobOptions, GlobResult } from './types.js';

/** glob() returns at most this many files (and sets `truncated`). */
export const GLOB_MAX_RESULTS = 1000;
/** glob() stops walking after this long (and sets `truncated`). */
export const GLOB_TIME_BUDGET_MS = 20_000;

/** {@link BaseSandbox.glob}: matched on the sandbox side (runtime/server/file-tools/glob.ts). */
export async function globFiles(
  runner: ToolRunner,
  pattern: string,
  options: GlobOptions = {},
): Promise<GlobResult> {
  const path = options.path ?? '.';
  const style = options.style ?? 'reference';
  if (!GLOB_STYLES.includes(style)) {
    const styles = GLOB_STYLES.map((s) => `'${s}'`).join(' or ');
    return {
      error: `Glob style must be ${styles}, not ${JSON.stringify(style)}`,
      errorCode: 'invalid_argument',
      truncated: false,
    };
  }
  const outcome = await runner.run('glob', {
    pattern,
    path,
    maxResults: GLOB_MAX_RESULTS,
    budgetMs: timeBudget(options.timeBudgetMs, GLOB_TIME_BUDGET_MS),
    style,
    includeDirs: options.includeDirs === true,
    relative: options.relative === true,
  });
  if (!outcome.ok) return { error: outcome.error, truncated: false };
  const answer = outcome.value;
  if (!isToolError(answer)) return answer;
  switch (answer.error) {
    case 'invalid_pattern':
      return {
        errorCode: answer.error,
        error: `Pattern '${pattern}': invalid_pattern ('..' segments may not leave the search root; a class such as [z-a] is invalid)`,
        truncated: false,
      };
    case 'file_not_found':
      return { error: `Path '${path}' not found`, errorCode: answer.error, truncated: false };
    case 'not_a_directory':
      return {
        error: `Path '${path}' is not a directory`,
        errorCode: answer.error,
        truncated: false,
      };
    case 'permission_denied':
      return {
        error: `Permission denied searching '${path}'`,
        errorCode: answer.error,
        truncated: false,
      };
    default:
      return {
        errorCode: answer.error,
        error: `Error globbing in '${path}': ${answer.detail ?? answer.error}`,
        truncated: false,
      };
  }
}
