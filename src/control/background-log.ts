/** The same failure of background work is printed at most once per this long. */
const REPEAT_AFTER_MS = 60_000;

/**
 * A logger for the daemon's background work (reaper passes, warm-pool refills): while the
 * registry's database is down every pass fails alike, so each distinct message is printed once a
 * minute, and once more when that work succeeds again (`recovered`).
 */
export class BackgroundLog {
  private readonly last = new Map<string, { message: string; at: number }>();

  constructor(private readonly print: (line: string) => void = (line) => console.error(line)) {}

  failed(what: string, error: unknown): void {
    const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    const seen = this.last.get(what);
    const now = Date.now();
    if (seen && seen.message === message && now - seen.at < REPEAT_AFTER_MS) return;
    this.last.set(what, { message, at: now });
    this.print(`${what}: ${message}`);
  }

  recovered(what: string): void {
    if (this.last.delete(what)) this.print(`${what}: working again`);
  }
}
