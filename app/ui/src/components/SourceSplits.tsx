// The splits of a running job's source subtasks as they last reported: each split's position and its lag (how far it
// trails the split's end: records behind a Kafka partition's high watermark, bytes or rows left of a file).
import type { VertexLiveMetrics } from "../api/client";
import { count } from "../format";

export function SourceSplits({ live }: { live: Map<string, VertexLiveMetrics> }) {
  const subtasks = [...live.values()].flatMap((v) => v.subtasks).filter((s) => s.metrics.splits != null);
  if (subtasks.length === 0) return null;
  const rows = subtasks.flatMap((s) =>
    (s.metrics.splits ?? []).map((split) => ({ split, subtask: `${s.vertex}[${s.subtask_index}]` })),
  );
  const more = subtasks.filter((s) => (s.metrics.splits_more ?? 0) > 0);
  return (
    <div class="panel">
      <h2>Source splits</h2>
      <table class="data source-splits">
        <thead>
          <tr>
            <th>Split</th>
            <th>Subtask</th>
            <th class="num">Position</th>
            <th class="num" title="how far the position trails the split's end (records, or bytes or rows of a file)">
              Lag
            </th>
          </tr>
        </thead>
        <tbody>
          {rows.map(({ split, subtask }) => (
            <tr data-split={split.split}>
              <td>{split.split}</td>
              <td>{subtask}</td>
              <td class="num position">{split.position ?? "–"}</td>
              <td class="num lag">{split.lag == null ? "–" : count(split.lag)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {more.map((s) => (
        <p class="muted splits-more">
          {`${s.vertex}[${s.subtask_index}]`}: and {count(s.metrics.splits_more ?? 0)} more splits (a subtask reports
          at most 100)
        </p>
      ))}
    </div>
  );
}
