/** Latency samples (milliseconds) summarised the way the bench tables show them. */
export interface Summary {
  n: number;
  p50: number;
  p99: number;
  min: number;
  max: number;
  /** Interquartile range: the spread of the middle half of the samples. */
  iqr: number;
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[index] as number;
}

export function summarize(samples: readonly number[]): Summary {
  const sorted = [...samples].sort((a, b) => a - b);
  return {
    n: sorted.length,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    min: sorted[0] ?? Number.NaN,
    max: sorted[sorted.length - 1] ?? Number.NaN,
    iqr: percentile(sorted, 75) - percentile(sorted, 25),
  };
}

export const median = (values: readonly number[]) =>
  percentile(
    [...values].sort((a, b) => a - b),
    50,
  );

/** Times `fn` `n` times after `warmup` untimed runs; returns per-call milliseconds. */
export async function timeEach(
  n: number,
  fn: (i: number) => Promise<unknown>,
  warmup = Math.min(20, n),
): Promise<number[]> {
  for (let i = 0; i < warmup; i++) await fn(i);
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    const started = performance.now();
    await fn(i);
    samples.push(performance.now() - started);
  }
  return samples;
}

/**
 * Runs `fn` with `concurrency` callers until `total` calls are done; returns calls per second
 * and the latency summary.
 */
export async function throughput(
  concurrency: number,
  total: number,
  fn: (i: number) => Promise<unknown>,
): Promise<{ perSecond: number; latency: Summary }> {
  await Promise.all(Array.from({ length: Math.min(concurrency, 50) }, (_, i) => fn(i)));
  const latencies: number[] = [];
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < total) {
        const i = next++;
        const t = performance.now();
        await fn(i);
        latencies.push(performance.now() - t);
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  return { perSecond: total / seconds, latency: summarize(latencies) };
}

export const round = (value: number, digits = 2) => Number(value.toFixed(digits));
