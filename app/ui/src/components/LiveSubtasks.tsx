// The subtasks of a running job as they last reported: records/s, backpressure, watermark and its lag, and a restored
// subtask's replay, one row each.
import type { SubtaskLiveMetrics, VertexLiveMetrics } from "../api/client";
import { age, bytes, duration, eventTime, ms, percent, rate } from "../format";

type Recovery = NonNullable<SubtaskLiveMetrics["metrics"]["recovery"]>;

/** A restored subtask's replay: bytes replayed of those it restored while it replays, how long it took once done. */
function Replay({ r }: { r: Recovery }) {
  if (r.replay_finished_at !== null && r.replay_finished_at !== undefined) {
    const took = r.loop_started_at ? r.replay_finished_at - r.loop_started_at : null;
    return (
      <span title={`restored from checkpoint ${r.restored_checkpoint_id ?? "–"}`}>
        done {took === null ? "" : ms(took)}
      </span>
    );
  }
  const total = r.restored_bytes ?? 0;
  const done = r.replayed_bytes ?? 0;
  return (
    <span
      class="replaying"
      title={`restored from checkpoint ${r.restored_checkpoint_id ?? "–"}, ${r.restored_buffers ?? 0} buffers`}
    >
      <progress max={total || 1} value={total ? done : 0} /> {bytes(done)} / {bytes(total)}
    </span>
  );
}

export function LiveSubtasks({ live }: { live: Map<string, VertexLiveMetrics> }) {
  const rows: SubtaskLiveMetrics[] = [...live.values()].flatMap((v) => v.subtasks);
  if (rows.length === 0) return <p class="muted">No subtask has reported metrics in the last seconds.</p>;
  // the span the subtasks' rates cover (several seconds: under backpressure records move in bursts)
  const spans = rows.map((s) => s.metrics.window_ms).filter((w): w is number => !!w);
  const span = spans.length ? Math.round(Math.max(...spans) / 1000) : null;
  const restored = rows.some((s) => s.metrics.recovery);
  return (
    <table class="data live-subtasks">
      <thead>
        <tr>
          <th>Subtask</th>
          <th class="num rate-span" title="records taken per second, averaged over the span the subtask reported">
            Records/s{span ? ` (avg ${span} s)` : ""}
          </th>
          <th class="num">Backpressure{span ? ` (${span} s)` : ""}</th>
          <th>Watermark</th>
          <th class="num">Lag</th>
          {restored && <th title="in-flight data restored from the checkpoint, replayed so far">Replay</th>}
          <th>Reported</th>
        </tr>
      </thead>
      <tbody>
        {rows.map((s) => {
          const m = s.metrics;
          const name = `${s.vertex}[${s.subtask_index}]`;
          return (
            <tr data-subtask={name}>
              <td>{name}</td>
              <td class="num">{rate(m.records_in_per_second)}</td>
              <td class="num">{percent(m.backpressure)}</td>
              <td class="watermark">
                {eventTime(m.watermark)}
                {m.watermark_idle ? <span class="muted"> (idle)</span> : null}
              </td>
              <td class="num lag">{duration(m.watermark_lag_ms)}</td>
              {restored && <td class="replay">{m.recovery ? <Replay r={m.recovery} /> : "–"}</td>}
              <td class="muted">{age(s.timestamp)}</td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}
