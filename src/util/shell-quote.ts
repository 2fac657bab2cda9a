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
