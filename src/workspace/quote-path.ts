/** C escapes git writes in a quoted path; every other byte to quote is written in octal. */
const ESCAPES: Record<number, string> = {
  7: '\\a',
  8: '\\b',
  9: '\\t',
  10: '\\n',
  11: '\\v',
  12: '\\f',
  13: '\\r',
  34: '\\"',
  92: '\\\\',
};

/**
 * A path as git writes it with core.quotePath (the default): in double quotes with C escapes
 * and octal for control bytes and every byte over 0x7f, when it has any; else as it is. The
 * result is ASCII either way. No Node built-ins: the dashboard finds a change's section of a
 * patch with it too.
 */
export function quotePath(prefix: string, path: string): string {
  let needs = false;
  let out = '';
  for (const b of new TextEncoder().encode(prefix + path)) {
    if (b < 0x20 || b === 0x22 || b === 0x5c || b >= 0x7f) {
      needs = true;
      out += ESCAPES[b] ?? `\\${b.toString(8).padStart(3, '0')}`;
    } else {
      out += String.fromCharCode(b);
    }
  }
  return needs ? `"${out}"` : out;
}
