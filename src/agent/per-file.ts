/** True for a path no file can have: empty, or holding a NUL byte. */
export function isInvalidPath(path: string): boolean {
  return path === '' || path.includes('\0');
}

/**
 * Runs `run` for each path in order and collects one answer per input, the contract of
 * `uploadFiles` / `downloadFiles`. A path no file can have gets `invalid` without a call.
 */
export async function perFile<I, R>(
  items: readonly I[],
  pathOf: (item: I) => string,
  invalid: (path: string) => R,
  run: (item: I, path: string) => Promise<R>,
): Promise<R[]> {
  const answers: R[] = [];
  for (const item of items) {
    const path = pathOf(item);
    answers.push(isInvalidPath(path) ? invalid(path) : await run(item, path));
  }
  return answers;
}
