const CODES = {
  bold: [1, 22],
  dim: [2, 22],
  red: [31, 39],
  green: [32, 39],
  yellow: [33, 39],
  cyan: [36, 39],
} as const;

export type Colour = keyof typeof CODES;

/** A writable stream as far as styling cares. */
export interface OutputStream {
  isTTY?: boolean;
  columns?: number;
  write(text: string): unknown;
}

/**
 * Colour only for a person at a terminal: never into a pipe or a file, and never when `NO_COLOR`
 * is set to anything but the empty string (https://no-color.org).
 */
export function colourEnabled(stream: OutputStream = process.stdout): boolean {
  return stream.isTTY === true && !process.env.NO_COLOR;
}

/** `text` in a colour when `stream` takes colour, else as it is. */
export function paint(colour: Colour, text: string, stream: OutputStream = process.stdout): string {
  if (!colourEnabled(stream)) return text;
  const [on, off] = CODES[colour];
  return `\u001b[${on}m${text}\u001b[${off}m`;
}
