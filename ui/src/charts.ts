/** uPlot, loaded only by a sandbox's page (a dynamic import): the list needs none of it. */
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

export interface Series {
  label: string;
  /** How a value reads in the legend. */
  format(value: number | null): string;
  color: string;
}

export interface Chart {
  setData(times: number[], columns: (number | null)[][]): void;
  resize(width: number): void;
  destroy(): void;
}

/** A time-series chart in `element`: x in seconds since the epoch. */
export function timeChart(
  element: HTMLElement,
  title: string,
  series: Series[],
  yRange?: [number, number],
): Chart {
  const plot = new uPlot(
    {
      title,
      width: Math.max(280, element.clientWidth),
      height: 220,
      scales: { x: { time: true }, y: yRange ? { range: yRange } : { auto: true } },
      axes: [
        { stroke: '#333' },
        {
          stroke: '#333',
          size: 70,
          values: (_u, splits) => splits.map((v) => series[0]?.format(v) ?? String(v)),
        },
      ],
      series: [
        {},
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 2,
          value: (_u: uPlot, v: number | null) => s.format(v),
        })),
      ],
    },
    [[], ...series.map(() => [])],
    element,
  );
  return {
    setData(times, columns) {
      plot.setData([times, ...columns] as uPlot.AlignedData);
    },
    resize(width) {
      plot.setSize({ width: Math.max(280, width), height: 220 });
    },
    destroy() {
      plot.destroy();
    },
  };
}
