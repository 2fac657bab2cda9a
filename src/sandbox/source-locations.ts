import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Names the place of a line of compiled code in the file the user wrote: `file:line`. */
export type Locator = (line: number) => string;

const BASE64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';

interface SourceMap {
  sources?: string[];
  sourceRoot?: string;
  mappings?: string;
}

/**
 * The locator of a compiled module: through its source map when it names one (tsc's
 * `sourceMap: true`, inline or beside the file), so that a message points at the `.ts` line;
 * else the module's own lines.
 */
export async function sourceLocator(file: string, source: string): Promise<Locator> {
  const own: Locator = (line) => `${file}:${line}`;
  const url = /\/\/[#@] sourceMappingURL=(\S+)\s*$/.exec(source)?.[1];
  if (!url) return own;
  try {
    let text: string;
    const inline = /^data:application\/json[^,]*?(;base64)?,(.*)$/.exec(url);
    if (inline) {
      text = inline[1]
        ? Buffer.from(inline[2] ?? '', 'base64').toString('utf8')
        : decodeURIComponent(inline[2] ?? '');
    } else {
      const mapFile = url.startsWith('file:')
        ? fileURLToPath(url)
        : resolve(dirname(file), decodeURIComponent(url));
      text = await readFile(mapFile, 'utf8');
      return locatorOfMap(text, mapFile, file);
    }
    return locatorOfMap(text, file, file);
  } catch {
    return own;
  }
}

/**
 * The locator of a source map (JSON text): a generated line maps to the original line of its
 * first mapped segment. `mapFile` is where the map lives (its sources are relative to it);
 * lines with no mapping keep `fallback`'s own line.
 */
export function locatorOfMap(text: string, mapFile: string, fallback: string): Locator {
  const map = JSON.parse(text) as SourceMap;
  const sources = (map.sources ?? []).map((source) =>
    resolve(dirname(mapFile), map.sourceRoot ?? '', source),
  );
  const lines = decode(map.mappings ?? '');
  return (line) => {
    const found = lines[line - 1];
    const source = found && sources[found.source];
    return source ? `${source}:${found.line + 1}` : `${fallback}:${line}`;
  };
}

/** Per generated line, the source and (0-based) line of its first segment that has one. */
function decode(mappings: string): ({ source: number; line: number } | undefined)[] {
  const out: ({ source: number; line: number } | undefined)[] = [];
  // Source index and original line are deltas across the whole map; columns reset per line.
  let source = 0;
  let line = 0;
  for (const generated of mappings.split(';')) {
    let first: { source: number; line: number } | undefined;
    for (const segment of generated.split(',')) {
      if (!segment) continue;
      const fields = vlq(segment);
      if (fields.length < 4) continue;
      source += fields[1] ?? 0;
      line += fields[2] ?? 0;
      first ??= { source, line };
    }
    out.push(first);
  }
  return out;
}

function vlq(segment: string): number[] {
  const values: number[] = [];
  let value = 0;
  let shift = 0;
  for (const char of segment) {
    const digit = BASE64.indexOf(char);
    if (digit < 0) return [];
    value += (digit & 31) << shift;
    if (digit & 32) {
      shift += 5;
      continue;
    }
    values.push(value & 1 ? -(value >>> 1) : value >>> 1);
    value = 0;
    shift = 0;
  }
  return values;
}
