// The job graph drawn as layers of vertices (by longest path from the sources) joined by partitioned edges; with live
// metrics, each vertex shows its records/s and its backpressure (the busiest subtask's share of time blocked on output),
// and its low watermark with its lag behind the wall clock.
import type { Graph, VertexLiveMetrics } from "../api/client";
import { duration, eventTime, percent, rate } from "../format";

const W = 226;
const H = 98;
const GAP_X = 76;
const GAP_Y = 26;
const PAD = 16;

export function layout(graph: Graph) {
  const layer = new Map<string, number>(graph.vertices.map((v) => [v.id, 0]));
  for (let i = 0; i < graph.vertices.length; i++) {
    let changed = false;
    for (const e of graph.edges ?? []) {
      const next = (layer.get(e.source) ?? 0) + 1;
      if (next > (layer.get(e.target) ?? 0)) {
        layer.set(e.target, next);
        changed = true;
      }
    }
    if (!changed) break;
  }
  const columns: string[][] = [];
  for (const v of graph.vertices) (columns[layer.get(v.id) ?? 0] ??= []).push(v.id);
  const tallest = Math.max(...columns.map((c) => c?.length ?? 0));
  const pos = new Map<string, { x: number; y: number }>();
  columns.forEach((ids, col) => {
    const offset = ((tallest - ids.length) * (H + GAP_Y)) / 2;
    ids.forEach((id, row) => pos.set(id, { x: PAD + col * (W + GAP_X), y: PAD + offset + row * (H + GAP_Y) }));
  });
  const width = PAD * 2 + columns.length * W + (columns.length - 1) * GAP_X;
  const height = PAD * 2 + tallest * H + (tallest - 1) * GAP_Y;
  return { pos, width, height };
}

/** Flink's thresholds: up to 10% OK, up to 50% low, above that high. */
export function pressure(share: number | null | undefined): "ok" | "low" | "high" | "none" {
  if (share === null || share === undefined) return "none";
  return share <= 0.1 ? "ok" : share <= 0.5 ? "low" : "high";
}

/** "watermark 12:00:01.250 · lag 1.2 s", or a dash without event time. */
export function watermarkLine(m: VertexLiveMetrics): string {
  if (m.low_watermark === null || m.low_watermark === undefined) return "watermark –";
  return `watermark ${eventTime(m.low_watermark)} · lag ${duration(m.watermark_lag_max_ms)}`;
}

export function GraphView({ graph, live }: { graph: Graph; live?: Map<string, VertexLiveMetrics> }) {
  const { pos, width, height } = layout(graph);
  return (
    <svg
      class="graph"
      viewBox={`0 0 ${width} ${height}`}
      width={width}
      height={height}
      role="img"
      aria-label="job graph"
    >
      <defs>
        <marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto">
          <path d="M0,0 L10,5 L0,10 z" fill="#7b8794" />
        </marker>
      </defs>
      {(graph.edges ?? []).map((e) => {
        const a = pos.get(e.source);
        const b = pos.get(e.target);
        if (!a || !b) return null;
        const x1 = a.x + W;
        const y1 = a.y + H / 2;
        const x2 = b.x;
        const y2 = b.y + H / 2;
        const mx = (x1 + x2) / 2;
        const part = e.partitioning ?? "forward";
        return (
          <g class={`edge edge-${part}`} data-edge={`${e.source}->${e.target}`}>
            <path d={`M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`} marker-end="url(#arrow)" />
            <text x={mx} y={(y1 + y2) / 2 - 6} text-anchor="middle">
              {part}
            </text>
          </g>
        );
      })}
      {graph.vertices.map((v) => {
        const p = pos.get(v.id)!;
        const m = live?.get(v.id);
        const level = m && m.reporting > 0 ? pressure(m.backpressure_max) : "none";
        return (
          <g
            class={`vertex vertex-${v.kind ?? "operator"} bp-${level}`}
            data-vertex={v.id}
            transform={`translate(${p.x},${p.y})`}
          >
            <rect width={W} height={H} rx="8" />
            <text x="12" y="23" class="vertex-name">
              {v.name ?? v.id}
            </text>
            <text x="12" y="43" class="vertex-meta">
              {`${v.kind ?? "operator"}${v.keyed ? " · keyed" : ""} · parallelism ${v.parallelism}`}
            </text>
            <text x="12" y="63" class="vertex-live" data-live={v.id}>
              {m && m.reporting > 0
                ? `${rate(m.records_in_per_second)} · backpressure ${percent(m.backpressure_max)}`
                : live
                  ? "no live metrics"
                  : ""}
              <title>
                {m && m.reporting > 0
                  ? `${m.reporting}/${m.parallelism} subtasks reporting; records taken per second, summed; backpressure: ` +
                    `the most blocked subtask's share of time waiting for room in its outputs ` +
                    `(average ${percent(m.backpressure_avg)})`
                  : "its subtasks have not reported metrics recently"}
              </title>
            </text>
            {m && m.reporting > 0 && (
              <text x="12" y="83" class="vertex-watermark" data-watermark={v.id}>
                {watermarkLine(m)}
                <title>
                  {"the lowest watermark of its subtasks (idle ones left out unless all are idle) and how far the " +
                    "furthest behind trails the wall clock"}
                </title>
              </text>
            )}
          </g>
        );
      })}
    </svg>
  );
}
