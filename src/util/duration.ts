const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * Parses a duration: `500ms`, `30s`, `10m`, `1h`, `1d`, or a bare number of seconds. Returns
 * milliseconds, or `undefined` when the text is not a positive duration.
 */
export function parseDuration(value: string | number): number | undefined {
  if (typeof value === 'number') {
    return Number.isFinite(value) && value > 0 ? Math.round(value * 1000) : undefined;
  }
  const match = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$/.exec(value);
  if (!match) return undefined;
  const ms = Math.round(Number(match[1]) * UNITS[match[2] ?? 's']);
  return ms > 0 ? ms : undefined;
}
