/**
 * Quotes a value as one POSIX shell word: single quotes, each `'` written as `'\''`. Nothing
 * inside single quotes is special to the shell, so the value stays literal text. A NUL byte cannot
 * be held by any shell string (the OS cuts the argument there), so it is refused rather than
 * silently truncated.
 */
export function shellQuote(value: string): string {
  if (value.includes('\0')) throw new TypeError('a shell word cannot contain a NUL byte');
  return `'${value.replaceAll("'", `'\\''`)}'`;
}

/**
 * A program and its arguments as the shell line that runs exactly them in place of the shell
 * (`exec 'prog' 'arg' …`): how envd lists a process it started from an argv, and what the E2B
 * face reads back as E2B's `cmd` and `args`.
 */
export function execLine(argv: readonly string[]): string {
  return `exec ${argv.map(shellQuote).join(' ')}`;
}
