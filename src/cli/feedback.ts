import { type OutputStream, paint } from './style.js';

const FRAMES = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
const CLEAR_LINE = '\r\u001b[2K';

/**
 * Runs `work` with a spinner on stderr while it lasts. Only on a terminal: in a pipe or a log the
 * spinner would be noise, so there it prints nothing. Output stays on stdout, untouched.
 */
export async function withSpinner<T>(
  text: string,
  work: () => Promise<T>,
  stream: OutputStream = process.stderr,
): Promise<T> {
  if (stream.isTTY !== true) return work();
  let frame = 0;
  const draw = () =>
    stream.write(
      `${CLEAR_LINE}${paint('cyan', FRAMES[frame++ % FRAMES.length] ?? '', stream)} ${text}`,
    );
  draw();
  const timer = setInterval(draw, 80);
  try {
    return await work();
  } finally {
    clearInterval(timer);
    stream.write(CLEAR_LINE);
  }
}

/** Transfers smaller than this finish before a bar would be worth reading. */
const PROGRESS_MIN_BYTES = 1024 * 1024;
const REDRAW_MS = 100;

export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

/**
 * A progress bar on stderr for a transfer of `total` bytes (a byte counter when the total is
 * unknown). Drawn only on a terminal and only for large transfers; otherwise every call is a
 * no-op, so callers need not check.
 */
export class ProgressBar {
  private done = 0;
  private lastDraw = 0;
  private readonly enabled: boolean;

  constructor(
    private readonly label: string,
    private readonly total: number | undefined,
    private readonly stream: OutputStream = process.stderr,
  ) {
    this.enabled = stream.isTTY === true && (total === undefined || total >= PROGRESS_MIN_BYTES);
  }

  /** Counts `bytes` more as transferred. */
  advance(bytes: number): void {
    this.done += bytes;
    const now = Date.now();
    if (!this.enabled || now - this.lastDraw < REDRAW_MS) return;
    this.lastDraw = now;
    this.draw();
  }

  /** Removes the bar. */
  finish(): void {
    if (this.enabled && this.lastDraw > 0) this.stream.write(CLEAR_LINE);
  }

  private draw(): void {
    const amount = formatBytes(this.done);
    if (!this.total) {
      this.stream.write(`${CLEAR_LINE}${this.label} ${amount}`);
      return;
    }
    const ratio = Math.min(1, this.done / this.total);
    const width = Math.max(10, Math.min(40, (this.stream.columns ?? 80) - this.label.length - 30));
    const filled = Math.round(ratio * width);
    const bar = `${'█'.repeat(filled)}${'░'.repeat(width - filled)}`;
    this.stream.write(
      `${CLEAR_LINE}${this.label} ${paint('cyan', bar, this.stream)} ${Math.floor(ratio * 100)}% ${amount}/${formatBytes(this.total)}`,
    );
  }
}
