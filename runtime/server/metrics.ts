/** Request counters for `/system/metrics`. */
export class Metrics {
  readonly startedAt = Date.now();
  private requests = 0;
  private inFlight = 0;
  private totalMs = 0;
  private readonly byStatus: Record<string, number> = {};

  /** Counts a request from its arrival; call the function returned when its answer has ended. */
  start(): (status: number) => void {
    // process.hrtime, not the global `performance`: its first use loads perf_hooks, which cost a
    // fresh envd's first request 5-20 ms.
    const started = process.hrtime.bigint();
    this.requests++;
    this.inFlight++;
    return (status) => {
      this.inFlight--;
      this.totalMs += Number(process.hrtime.bigint() - started) / 1e6;
      this.byStatus[status] = (this.byStatus[status] ?? 0) + 1;
    };
  }

  snapshot() {
    const finished = this.requests - this.inFlight;
    return {
      uptime_s: (Date.now() - this.startedAt) / 1000,
      requests: this.requests,
      in_flight: this.inFlight,
      by_status: { ...this.byStatus },
      mean_ms: finished > 0 ? this.totalMs / finished : 0,
      memory_rss: process.memoryUsage().rss,
    };
  }
}
