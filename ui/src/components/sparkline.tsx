/**
 * A small line chart as SVG (the sandboxes list shows two per row): no chart library on the
 * page that loads first.
 */
interface Props {
  values: number[];
  /** The top of the scale (100 for a percentage); default the largest value. */
  max?: number;
  label: string;
  width?: number;
  height?: number;
}

export function Sparkline({ values, max, label, width = 96, height = 24 }: Props) {
  const top = Math.max(max ?? 0, ...values, 1e-9);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values
    .map((v, i) => `${(i * step).toFixed(1)},${(height - 1 - (v / top) * (height - 2)).toFixed(1)}`)
    .join(' ');
  return (
    <svg class="spark" width={width} height={height} role="img" aria-label={label}>
      <title>{label}</title>
      {values.length > 1 ? (
        <polyline points={points} fill="none" stroke="currentColor" stroke-width="1.5" />
      ) : (
        <line x1="0" x2={width} y1={height - 1} y2={height - 1} stroke="currentColor" />
      )}
    </svg>
  );
}
