/**
 * A duration in whole milliseconds from the environment variable `name`: `fallback` when it is
 * unset or empty; an Error naming the variable when it is not a whole number of at least `least`.
 */
export function envMilliseconds(
  name: string,
  fallback: number,
  least: number,
  env: NodeJS.ProcessEnv = process.env,
): number {
  const text = env[name];
  if (text === undefined || text === '') return fallback;
  const ms = Number(text);
  if (!Number.isSafeInteger(ms) || ms < least) {
    throw new Error(
      `${name} must be a whole number of milliseconds, ${least} or more, not '${text}'`,
    );
  }
  return ms;
}
