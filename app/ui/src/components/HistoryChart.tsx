// End-to-end duration and persisted in-flight bytes over the checkpoint history; aligned and unaligned told apart.
// The scale follows the steady checkpoints: a warm-up checkpoint or a savepoint above it is drawn clipped, with its
// real value.
import { interrupted, type Checkpoint } from "../api/client";
import { bytes, ms } from "../format";
import { steadyMax } from "../warmup";

const W = 1200;
const PANEL = 120;
const GAP = 40;
const LEFT = 70;
const RIGHT = 10;
const TOP = 26;

function kind(c: Checkpoint): string {
  if (interrupted(c)) return "interrupted";
  if (c.status === "ABORTED") return "failed";
  if (c.status === "PENDING") return "pending";
  return c.is_savepoint ? "savepoint" : c.checkpoint_type;
}

function ticks(max: number, fmt: (v: number) => string) {
  return [0, 0.5, 1].map((f) => ({ y: f, label: fmt(max * f) }));
}

/** checkpoints: oldest first; warm: the warm-up checkpoints among them. */
export function HistoryChart({
  jobId,
  checkpoints,
  warm,
}: {
  jobId: number;
  checkpoints: Checkpoint[];
  warm: Set<number>;
}) {
  const n = checkpoints.length;
  const plotW = W - LEFT - RIGHT;
  const step = plotW / Math.max(n, 1);
  const barW = Math.max(1, Math.min(18, step * 0.8));
  const height = TOP + PANEL * 2 + GAP + 26;
  const panels = [
    {
      title: "end-to-end duration",
      top: TOP,
      value: (c: Checkpoint) => c.end_to_end_duration ?? 0,
      fmt: ms,
      none: !checkpoints.some((c) => c.end_to_end_duration),
    },
    {
      title: "persisted in-flight data",
      top: TOP + PANEL + GAP,
      value: (c: Checkpoint) => c.persisted_data,
      fmt: bytes,
      none: !checkpoints.some((c) => c.persisted_data > 0),
    },
  ];
  const clippedAny = panels.some((p) => {
    const max = steadyMax(checkpoints, warm, p.value);
    return checkpoints.some((c) => c.status === "COMPLETED" && p.value(c) > max);
  });
  return (
    <figure class="chart">
      <svg viewBox={`0 0 ${W} ${height}`} role="img" aria-label="checkpoint history chart">
        {panels.map((p) => {
          const max = steadyMax(checkpoints, warm, p.value);
          return (
            <g class="panel-g" data-panel={p.title} data-scale={max}>
              <text x={LEFT} y={p.top - 10} class="chart-title">
                {p.title}
              </text>
              {ticks(max, p.fmt)
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
                const clipped = c.status === "COMPLETED" && v > max;
                const h = c.status !== "COMPLETED" ? 4 : Math.min(PANEL, Math.max(v > 0 ? 1.5 : 0, (v / max) * PANEL));
                const x = LEFT + i * step + (step - barW) / 2;
                const what = c.is_savepoint ? "savepoint" : c.checkpoint_type;
                const note = warm.has(c.id) ? " (warm-up)" : "";
                return (
                  <a href={`#/jobs/${jobId}/checkpoints/${c.id}`}>
                    <rect
                      class={`bar bar-${kind(c)}${clipped ? " bar-clipped" : ""}${warm.has(c.id) ? " bar-warm" : ""}`}
                      data-checkpoint={c.id}
                      x={x}
                      y={p.top + PANEL - h}
                      width={barW}
                      height={h}
                    >
                      <title>{`#${c.id} ${what} ${c.status}${note}: ${p.fmt(v)}`}</title>
                    </rect>
                    {clipped && (
                      <text class="clip-mark" x={x + barW / 2} y={p.top - 1} text-anchor="middle">
                        ▲
                      </text>
                    )}
                  </a>
                );
              })}
            </g>
          );
        })}
        {n > 0 && (
          <g class="tick">
            <text x={LEFT} y={height - 6}>{`#${checkpoints[0].id}`}</text>
            <text x={W - RIGHT} y={height - 6} text-anchor="end">{`#${checkpoints[n - 1].id}`}</text>
          </g>
        )}
      </svg>
      <figcaption class="legend">
        {["aligned", "unaligned", "savepoint", "failed", "interrupted", "pending"].map((k) => (
          <span>
            <i class={`swatch bar-${k}`} /> {k}
          </span>
        ))}
        {clippedAny && (
          <span class="muted">
            ▲ above the scale: warm-up checkpoints (up to each attempt's first completed one) and savepoints do not
            set it; hover for the value
          </span>
        )}
      </figcaption>
    </figure>
  );
}
