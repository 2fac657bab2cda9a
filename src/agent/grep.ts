import { SEARCH_BUDGET_MS } from '../../runtime/server/file-tools/protocol.js';
import { isToolError, type ToolRunner } from './tool-runner.js';
import type { GrepOptions, GrepResult } from './types.js';

/** grep() stops searching after this long by default (and sets `truncated`). */
export const GREP_TIME_BUDGET_MS = SEARCH_BUDGET_MS;

/** {@link BaseSandbox.grep}: a literal substring search, on the sandbox side (file-tools/). */
export async function grepFiles(
  runner: ToolRunner,
  pattern: string,
  options: GrepOptions = {},
): Promise<GrepResult> {
  const path = options.path ?? '.';
  const maxCount =
    options.maxCount === undefined ? null : Math.max(0, Math.floor(Number(options.maxCount) || 0));
  const outcome = await runner.run('grep', {
    pattern,
    path,
    glob: options.glob ?? null,
    maxCount,
    budgetMs: timeBudget(options.timeBudgetMs, GREP_TIME_BUDGET_MS),
  });
  if (!outcome.ok) return { error: outcome.error, truncated: false };
  const answer = outcome.value;
  if (!isToolError(answer)) return answer;
  switch (answer.error) {
    case 'file_not_found':
      return { error: `Path '${path}' not found`, errorCode: answer.error, truncated: false };
    case 'permission_denied':
      return {
        error: `Permission denied searching '${path}'`,
        errorCode: answer.error,
        truncated: false,
      };
    case 'invalid_pattern':
      return {
        errorCode: answer.error,
        error: `Glob '${options.glob}': invalid_pattern ('..' segments may not leave the search root)`,
        truncated: false,
      };
    default:
      return {
        errorCode: answer.error,
        error: `Error searching '${path}': ${answer.detail ?? answer.error}`,
        truncated: false,
      };
  }
}

/** A time budget option as whole milliseconds (not negative), or `fallback` when not given. */
export function timeBudget(value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const ms = Math.floor(Number(value));
  return Number.isFinite(ms) ? Math.max(0, ms) : fallback;
}
