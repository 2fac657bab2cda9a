import type { Sandbox, SandboxMetric } from '../../src/index.js';

/**
 * The first sample of `box` taken from now on that `ok` accepts, polling the SDK every 200 ms;
 * fails after 60 s, naming `what` and the last sample seen.
 */
export async function sampleWhere(
  box: Sandbox,
  what: string,
  ok: (m: SandboxMetric) => boolean,
): Promise<SandboxMetric> {
  const since = Date.now();
  let last: SandboxMetric | undefined;
  for (;;) {
    const samples = await box.getMetrics({ start: since });
    const found = samples.find(ok);
    if (found) return found;
    last = samples.at(-1) ?? last;
    if (Date.now() > since + 60_000) {
      throw new Error(`no sample with ${what} within 60 s; the last: ${JSON.stringify(last)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}
