import { useEffect, useRef, useState } from 'preact/hooks';
import { api, type SandboxInfo, type SandboxMetric, sandboxPath } from '../api.js';
import type { Chart } from '../charts.js';
import { bytes, errorText, percent } from '../format.js';
import { useLive } from '../live.js';

/** CPU and memory over the sandbox's life (the daemon keeps its last 720 samples). */
export function MetricsTab({ sandbox }: { sandbox: SandboxInfo }) {
  const id = sandbox.sandboxId;
  const live = useLive();
  const [history, setHistory] = useState<SandboxMetric[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const cpuRef = useRef<HTMLDivElement>(null);
  const memRef = useRef<HTMLDivElement>(null);
  const charts = useRef<{ cpu: Chart; mem: Chart } | null>(null);
  /** Bumped when the charts exist, to draw what has come meanwhile. */
  const [tick, setTick] = useState(0);

  useEffect(() => {
    let stop = false;
    api<{ metrics: SandboxMetric[] }>('GET', sandboxPath(id, '/metrics'))
      .then(({ metrics }) => !stop && setHistory(metrics))
      .catch((error) => !stop && setFailure(errorText(error)));
    return () => {
      stop = true;
    };
  }, [id]);

  // The charts' code arrives with the first look at them.
  useEffect(() => {
    let stop = false;
    let observer: ResizeObserver | undefined;
    import('../charts.js')
      .then(({ timeChart }) => {
        if (stop || !cpuRef.current || !memRef.current) return;
        const cpu = timeChart(
          cpuRef.current,
          'CPU',
          [{ label: 'CPU', color: '#1a5fb4', format: (v) => percent(v) }],
          [0, 100],
        );
        // The limit is in the line above the charts: drawn here, a host's whole memory would
        // flatten the line that matters.
        const mem = timeChart(memRef.current, 'Memory', [
          { label: 'used', color: '#813d9c', format: (v) => bytes(v) },
        ]);
        charts.current = { cpu, mem };
        observer = new ResizeObserver(() => {
          cpu.resize(cpuRef.current?.clientWidth ?? 600);
          mem.resize(memRef.current?.clientWidth ?? 600);
        });
        observer.observe(cpuRef.current);
        setTick((n) => n + 1);
      })
      .catch((error) => setFailure(`the charts did not load: ${errorText(error)}`));
    return () => {
      stop = true;
      observer?.disconnect();
      charts.current?.cpu.destroy();
      charts.current?.mem.destroy();
      charts.current = null;
    };
  }, []);

  const recent = live.metrics.get(id) ?? [];
  const samples = mergeSamples(history ?? [], recent);
  useEffect(() => {
    const chart = charts.current;
    if (!chart) return;
    const times = samples.map((s) => Date.parse(s.timestamp) / 1000);
    chart.cpu.setData(times, [samples.map((s) => s.cpuUsedPct)]);
    chart.mem.setData(times, [samples.map((s) => s.memUsed)]);
  }, [samples.length, samples[samples.length - 1]?.timestamp, tick]);

  const last = samples[samples.length - 1];
  return (
    <section aria-labelledby="metrics-title">
      <h2 id="metrics-title">Metrics</h2>
      {failure && <p class="notice">{failure}</p>}
      {last && (
        <p class="facts-line">
          CPU {percent(last.cpuUsedPct)} of {last.cpuCount} cores · memory {bytes(last.memUsed)} of{' '}
          {bytes(last.memTotal)} · disk {bytes(last.diskUsed)} of {bytes(last.diskTotal)} ·{' '}
          {last.processes} processes
          {last.netRxBytes !== null &&
            ` · network ${bytes(last.netRxBytes)} in, ${bytes(last.netTxBytes)} out`}
        </p>
      )}
      <div class="charts">
        <div ref={cpuRef} class="chart" aria-label="CPU use over time" role="img" />
        <div ref={memRef} class="chart" aria-label="Memory use over time" role="img" />
      </div>
      <p class="hint">{samples.length} samples</p>
    </section>
  );
}

function mergeSamples(history: SandboxMetric[], recent: SandboxMetric[]): SandboxMetric[] {
  const lastAt = history[history.length - 1]?.timestamp ?? '';
  return [...history, ...recent.filter((s) => s.timestamp > lastAt)];
}
