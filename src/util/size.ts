const UNITS: Record<string, number> = { '': 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 };

/**
 * Parses a byte size: a number of bytes, or `512K`, `100M`, `2G` (binary units, an optional
 * trailing `B`/`iB`, any case). Returns `undefined` when the text is not a positive size.
 */
export function parseSize(value: string | number): number | undefined {
  if (typeof value === 'number') {
    return Number.isSafeInteger(value) && value > 0 ? value : undefined;
  }
  const match = /^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$/i.exec(value);
  if (!match) return undefined;
  const bytes = Math.floor(Number(match[1]) * (UNITS[(match[2] ?? '').toLowerCase()] ?? 1));
  return bytes > 0 ? bytes : undefined;
}
