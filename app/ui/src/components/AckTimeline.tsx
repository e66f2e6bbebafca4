// When each subtask acknowledged, after the trigger: start delay, alignment, sync and async parts, then the rest (the
// upload of its state with the acknowledgement, which the async figure does not include yet).
import type { CheckpointDetail } from "../api/client";
import { ms } from "../format";

const LEFT = 120;
const W = 1200;
const ROW = 20;
const MAX_ROWS = 60;

export function AckTimeline({ cp }: { cp: CheckpointDetail }) {
  const all = [...cp.subtasks].sort((a, b) => a.ack_timestamp - b.ack_timestamp);
  if (all.length === 0) return null;
  const subtasks = all.slice(-MAX_ROWS); // with many subtasks, the latest acks are the ones worth seeing
  const span = Math.max(1, ...subtasks.map((s) => s.ack_timestamp - cp.trigger_timestamp));
  const scale = (W - LEFT - 20) / span;
  const height = subtasks.length * ROW + 30;
  return (
    <figure class="chart timeline">
      <svg viewBox={`0 0 ${W} ${height}`} role="img" aria-label="timeline of acks">
        {[0, 0.25, 0.5, 0.75, 1].map((f) => (
          <g class="tick">
            <line x1={LEFT + f * span * scale} x2={LEFT + f * span * scale} y1={0} y2={height - 20} />
            <text
              x={LEFT + f * span * scale}
              y={height - 6}
              text-anchor={f === 1 ? "end" : f === 0 ? "start" : "middle"}
            >
              {`+${ms(f * span)}`}
            </text>
          </g>
        ))}
        {subtasks.map((s, i) => {
          const y = i * ROW + 4;
          const total = s.ack_timestamp - cp.trigger_timestamp;
          const parts: [string, number][] = [
            ["start-delay", s.start_delay],
            ["alignment", s.alignment_duration],
            ["sync", s.sync_duration],
            ["async", s.async_duration],
          ];
          let x = LEFT;
          const used = parts.reduce((a, [, v]) => a + v, 0);
          const fit = used > total && used > 0 ? total / used : 1;
          return (
            <g class="ack-row" data-subtask={`${s.vertex}[${s.subtask_index}]`}>
              <text x={LEFT - 8} y={y + 12} text-anchor="end">{`${s.vertex}[${s.subtask_index}]`}</text>
              <rect class="seg-total" x={LEFT} y={y + 2} width={Math.max(1, total * scale)} height={ROW - 6} />
              {parts.map(([name, v]) => {
                const w = v * fit * scale;
                const r = <rect class={`seg-${name}`} x={x} y={y + 2} width={w} height={ROW - 6} />;
                x += w;
                return r;
              })}
              <circle
                class={s.unaligned ? "ack-dot unaligned" : "ack-dot"}
                cx={LEFT + total * scale}
                cy={y + ROW / 2 - 1}
                r="4"
              >
                <title>{`${s.vertex}[${s.subtask_index}] acked +${ms(total)}`}</title>
              </circle>
            </g>
          );
        })}
      </svg>
      {all.length > subtasks.length && (
        <p class="muted">
          Showing the {subtasks.length} latest of {all.length} acks; the table below has them all.
        </p>
      )}
      <figcaption class="legend">
        <span>
          <i class="swatch seg-start-delay" /> start delay
        </span>
        <span>
          <i class="swatch seg-alignment" /> alignment
        </span>
        <span>
          <i class="swatch seg-sync" /> sync
        </span>
        <span>
          <i class="swatch seg-async" /> async (before the upload)
        </span>
        <span>
          <i class="swatch seg-total" /> until ack: the upload of the state with the acknowledgement (and an aligned
          barrier's wait in full outputs)
        </span>
        <span>
          <i class="swatch ack-dot-swatch" /> ack (filled: unaligned)
        </span>
      </figcaption>
    </figure>
  );
}
