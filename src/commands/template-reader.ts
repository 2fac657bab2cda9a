import { type Document, isMap, isScalar, type LineCounter } from 'yaml';

/** A key path into the YAML document: `['custom_commands', 'train', 'args', 0]`. */
export type Path = (string | number)[];

export function formatPath(path: Path): string {
  return path.reduce<string>(
    (text, key) => (typeof key === 'number' ? `${text}[${key}]` : text ? `${text}.${key}` : key),
    '',
  );
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Collects problems of a template, each located in the file and named by its key path. */
export class TemplateReader {
  readonly problems: { location: string; text: string }[] = [];

  constructor(
    private readonly file: string,
    private readonly doc: Document,
    private readonly lines: LineCounter,
  ) {}

  /** `file:line:column` of the node at `path`, or of its nearest ancestor that exists. */
  locate(path: Path): string {
    for (let depth = path.length; depth >= 0; depth--) {
      const node = this.doc.getIn(path.slice(0, depth), true) as { range?: [number, number] };
      if (node?.range) {
        const { line, col } = this.lines.linePos(node.range[0]);
        return `${this.file}:${line}:${col}`;
      }
    }
    return `${this.file}:1:1`;
  }

  /** `file:line:column` of the key of the entry at `path` (where a definition starts). */
  locateKey(path: Path): string {
    const parent = this.doc.getIn(path.slice(0, -1), true);
    const key = path[path.length - 1];
    if (isMap(parent)) {
      const pair = parent.items.find((item) => isScalar(item.key) && item.key.value === key);
      const range = isScalar(pair?.key) ? pair.key.range : undefined;
      if (range) {
        const { line, col } = this.lines.linePos(range[0]);
        return `${this.file}:${line}:${col}`;
      }
    }
    return this.locate(path);
  }

  problem(path: Path, message: string): void {
    const location = this.locate(path);
    this.problems.push({
      location,
      text: `${location}: ${formatPath(path) || '(top level)'}: ${message}`,
    });
  }

  checkKeys(value: Record<string, unknown>, allowed: string[], path: Path): void {
    for (const key of Object.keys(value)) {
      if (!allowed.includes(key)) {
        this.problem([...path, key], `unknown key; allowed here: ${allowed.join(', ')}`);
      }
    }
  }
}
