// The subtasks of a running job as they last reported: records/s, backpressure, watermark and its lag, one row each.
import type { SubtaskLiveMetrics, VertexLiveMetrics } from "../api/client";
import { age, duration, eventTime, percent, rate } from "../format";

export function LiveSubtasks({ live }: { live: Map<string, VertexLiveMetrics> }) {
  const rows: SubtaskLiveMetrics[] = [...live.values()].flatMap((v) => v.subtasks);
  if (rows.length === 0) return <p class="muted">No subtask has reported metrics in the last seconds.</p>;
  return (
    <table class="data live-subtasks">
      <thead>
        <tr>
          <th>Subtask</th>
          <th class="num">Records/s</th>
          <th class="num">Backpressure</th>
          <th>Watermark</th>
          <th class="num">Lag</th>
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
              <td class="muted">{age(s.timestamp)}</td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}
