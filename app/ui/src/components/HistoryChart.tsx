// End-to-end duration and persisted in-flight bytes over the checkpoint history; aligned and unaligned told apart.
import type { Checkpoint } from "../api/client";
import { bytes, ms } from "../format";

const W = 1200;
const PANEL = 120;
const GAP = 40;
const LEFT = 70;
const RIGHT = 10;
const TOP = 26;

function kind(c: Checkpoint): string {
  if (c.status === "ABORTED") return "failed";
  if (c.status === "PENDING") return "pending";
  return c.checkpoint_type;
}

function ticks(max: number, fmt: (v: number) => string) {
  return [0, 0.5, 1].map((f) => ({ y: f, label: fmt(max * f) }));
}

/** checkpoints: oldest first. */
export function HistoryChart({ jobId, checkpoints }: { jobId: number; checkpoints: Checkpoint[] }) {
  const n = checkpoints.length;
  const plotW = W - LEFT - RIGHT;
  const step = plotW / Math.max(n, 1);
  const barW = Math.max(1, Math.min(18, step * 0.8));
  const maxDur = Math.max(1, ...checkpoints.map((c) => c.end_to_end_duration ?? 0));
  const maxBytes = Math.max(1, ...checkpoints.map((c) => c.persisted_data));
  const height = TOP + PANEL * 2 + GAP + 26;
  const panels = [
    {
      title: "end-to-end duration",
      top: TOP,
      value: (c: Checkpoint) => c.end_to_end_duration ?? 0,
      max: maxDur,
      fmt: ms,
      none: !checkpoints.some((c) => c.end_to_end_duration),
    },
    {
      title: "persisted in-flight data",
      top: TOP + PANEL + GAP,
      value: (c: Checkpoint) => c.persisted_data,
      max: maxBytes,
      fmt: bytes,
      none: !checkpoints.some((c) => c.persisted_data > 0),
    },
  ];
  return (
    <figure class="chart">
      <svg viewBox={`0 0 ${W} ${height}`} role="img" aria-label="checkpoint history chart">
        {panels.map((p) => (
          <g class="panel-g" data-panel={p.title}>
            <text x={LEFT} y={p.top - 10} class="chart-title">
              {p.title}
            </text>
            {ticks(p.max, p.fmt)
              .filter((t) => !p.none || t.y === 0)
              .map((t) => {
                const y = p.top + PANEL - t.y * PANEL;
                return (
                  <g class="tick">
                    <line x1={LEFT} x2={W - RIGHT} y1={y} y2={y} />
                    <text x={LEFT - 6} y={y + 4} text-anchor="end">
                      {t.label}
                    </text>
                  </g>
                );
              })}
            {p.none && (
              <text x={(LEFT + W) / 2} y={p.top + PANEL / 2} text-anchor="middle" class="chart-none">
                {p.title === "persisted in-flight data"
                  ? "no in-flight data persisted in these checkpoints (all aligned, or nothing was in flight)"
                  : "no completed checkpoint in this window"}
              </text>
            )}
            {checkpoints.map((c, i) => {
              const v = p.value(c);
              const h = c.status !== "COMPLETED" ? 4 : Math.max(v > 0 ? 1.5 : 0, (v / p.max) * PANEL);
              const x = LEFT + i * step + (step - barW) / 2;
              return (
                <a href={`#/jobs/${jobId}/checkpoints/${c.id}`}>
                  <rect class={`bar bar-${kind(c)}`} x={x} y={p.top + PANEL - h} width={barW} height={h}>
                    <title>{`#${c.id} ${c.is_savepoint ? "savepoint" : c.checkpoint_type} ${c.status}: ${p.fmt(v)}`}</title>
                  </rect>
                </a>
              );
            })}
          </g>
        ))}
        {n > 0 && (
          <g class="tick">
            <text x={LEFT} y={height - 6}>{`#${checkpoints[0].id}`}</text>
            <text x={W - RIGHT} y={height - 6} text-anchor="end">{`#${checkpoints[n - 1].id}`}</text>
          </g>
        )}
      </svg>
      <figcaption class="legend">
        {["aligned", "unaligned", "savepoint", "failed", "pending"].map((k) => (
          <span>
            <i class={`swatch bar-${k}`} /> {k}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}
