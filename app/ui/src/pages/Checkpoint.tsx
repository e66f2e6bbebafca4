// A checkpoint: its fields and state, a per-vertex summary (min/avg/max across subtasks, as Flink shows it), a timeline
// of acks and the per-subtask table with the outliers (slowest, largest channel states) highlighted.
import { useEffect, useState } from "preact/hooks";
import { api, call, interrupted, type MinMaxAvg, type SubtaskStats, type VertexCheckpointSummary } from "../api/client";
import { AckTimeline } from "../components/AckTimeline";
import { Empty, ErrorView, Link, Pager, StaleBanner, Status, SubtaskModes, TypeBadge, useData } from "../components/common";
import { bytes, ms, percentile, time } from "../format";

const HIGHLIGHT = 3;
const OUTLIER = 1.5;
const ROWS = 100;
type Key = keyof SubtaskStats;

/** The outliers by `key`: at most one in ten subtasks (at most 3, at least 1), and only those above 1.5 times the
 * median, so an even checkpoint highlights nothing. */
export function outliers(subtasks: SubtaskStats[], key: (s: SubtaskStats) => number): Set<string> {
  const values = subtasks.map(key).sort((a, b) => a - b);
  const median = percentile(values, 0.5) ?? 0;
  const n = Math.min(HIGHLIGHT, Math.max(1, Math.floor(subtasks.length / 10)));
  const ranked = subtasks.filter((s) => key(s) > 0 && key(s) > OUTLIER * median).sort((a, b) => key(b) - key(a));
  return new Set(ranked.slice(0, n).map((s) => `${s.vertex}[${s.subtask_index}]`));
}

const ABORTED_BECAUSE: Record<string, string> = {
  job_ended: "the job ended before every subtask acknowledged it; this is how a job's last checkpoint ends",
  job_cancelled: "the job was cancelled before every subtask acknowledged it",
  new_attempt: "a new attempt started (a restart) before every subtask acknowledged it",
  subsumed: "a newer checkpoint completed first",
  expired: "it took longer than the job's checkpoint timeout",
  declined: "a subtask could not take it",
};

export function CheckpointPage({ jobId, cpId }: { jobId: number; cpId: number }) {
  const detail = useData(
    () =>
      call(
        api.GET("/api/v1/jobs/{job_id}/checkpoints/{checkpoint_id}", {
          params: { path: { job_id: jobId, checkpoint_id: cpId } },
        }),
      ),
    [jobId, cpId],
  );
  const [sort, setSort] = useState<{ key: Key; desc: boolean }>({ key: "end_to_end_duration", desc: true });
  const [offset, setOffset] = useState(0);
  const pending = detail.data?.status === "PENDING";
  useEffect(() => {
    if (!pending) return;
    const t = setInterval(detail.reload, 2000); // acks arrive without events: poll while it is pending
    return () => clearInterval(t);
  }, [pending, detail.reload]);
  if (!detail.data) {
    if (detail.error)
      return (
        <ErrorView
          error={detail.error}
          retry={detail.reload}
          notFound={
            <>
              <h2>
                Checkpoint {cpId} of job {jobId} not found
              </h2>
              <p>
                <Link href={`/jobs/${jobId}`}>Back to job {jobId}</Link>
              </p>
            </>
          }
        />
      );
    return <p class="muted">Loading checkpoint {cpId}…</p>;
  }
  const cp = detail.data;
  const slow = outliers(cp.subtasks, (s) => s.end_to_end_duration);
  const large = outliers(cp.subtasks, (s) => s.persisted_data);
  const deleted = cp.status === "ABORTED" || cp.discarded;
  const rows = [...cp.subtasks].sort((a, b) => {
    const x = a[sort.key] as number | string | boolean;
    const y = b[sort.key] as number | string | boolean;
    const c = x < y ? -1 : x > y ? 1 : a.subtask_index - b.subtask_index;
    return sort.desc ? -c : c;
  });
  const th = (key: Key, label: string, num = true) => (
    <th
      class={`${num ? "num" : ""} sortable ${sort.key === key ? "sorted" : ""}`}
      onClick={() => {
        setSort({ key, desc: sort.key === key ? !sort.desc : true });
        setOffset(0);
      }}
    >
      {label}
      {sort.key === key ? (sort.desc ? " ▾" : " ▴") : ""}
    </th>
  );
  return (
    <section>
      <p class="crumbs">
        <Link href="/">Jobs</Link> › <Link href={`/jobs/${jobId}`}>job {jobId}</Link> › checkpoint {cp.id}
      </p>
      <header class="page-head">
        <h1>
          {cp.is_savepoint ? "Savepoint" : "Checkpoint"} #{cp.id}{" "}
          {interrupted(cp) ? <span class="badge status-interrupted">NOT FINISHED</span> : <Status value={cp.status} />}{" "}
          <TypeBadge value={cp.is_savepoint ? "savepoint" : cp.checkpoint_type} />{" "}
          <SubtaskModes modes={cp.subtask_modes} />
        </h1>
        <div class="actions">
          <Link class="button" href={`/jobs/${jobId}/checkpoints/${cp.id}/in-flight`}>
            In-flight data ({bytes(cp.persisted_data)}
            {deleted && cp.persisted_data ? ", deleted" : ""})
          </Link>
          {pending && <button onClick={detail.reload}>Refresh</button>}
        </div>
      </header>
      <StaleBanner error={detail.error} retry={detail.reload} />
      {cp.status === "ABORTED" && (
        <div class={`notice ${interrupted(cp) ? "" : "notice-bad"} abort-notice`} role="status">
          <strong>{interrupted(cp) ? "Not completed, not a failure" : "Failed"}</strong>
          {cp.failure_timestamp ? ` at ${time(cp.failure_timestamp)}` : ""}:{" "}
          {cp.abort_reason ? ABORTED_BECAUSE[cp.abort_reason] : "aborted"}
          {cp.failure_reason ? (
            <>
              {" "}
              (<code>{cp.failure_reason}</code>)
            </>
          ) : (
            " (the coordinator recorded no reason)"
          )}
          . {cp.num_acknowledged_subtasks} of {cp.num_subtasks} subtasks had acknowledged it; their state was deleted.
          {cp.never_acked_subtasks && cp.never_acked_subtasks.length > 0 && (
            <div class="never-acked">
              Never acknowledged ({cp.never_acked_subtasks.length}): {cp.never_acked_subtasks.slice(0, 40).join(", ")}
              {cp.never_acked_subtasks.length > 40 ? " …" : ""}
            </div>
          )}
        </div>
      )}
      <dl class="facts">
        <dt>attempt</dt>
        <dd>{cp.attempt}</dd>
        <dt>policy</dt>
        <dd>
          {cp.policy}
          {cp.alignment_timeout !== null ? ` (timeout ${ms(cp.alignment_timeout)})` : ""}
          {cp.decision ? (
            <div class="decision" title={`the adaptive policy looked at ${cp.decision.based_on !== null && cp.decision.based_on !== undefined ? `checkpoint ${cp.decision.based_on}` : "no finished checkpoint"}`}>
              chosen by adaptive: {cp.decision.reason}
            </div>
          ) : null}
        </dd>
        <dt>triggered</dt>
        <dd>{time(cp.trigger_timestamp)}</dd>
        <dt>{cp.status === "ABORTED" ? "aborted" : "completed"}</dt>
        <dd>{time(cp.status === "ABORTED" ? cp.failure_timestamp : cp.completed_timestamp)}</dd>
        <dt>end to end</dt>
        <dd>{ms(cp.end_to_end_duration)}</dd>
        <dt>alignment, longest</dt>
        <dd>{ms(cp.alignment_duration)}</dd>
        <dt>start delay, longest</dt>
        <dd class="start-delay">
          {ms(cp.start_delay)}
          {cp.checkpoint_type === "aligned" || cp.is_savepoint ? (
            <span class="muted"> (an aligned barrier's wait behind the buffers queued in front of it)</span>
          ) : null}
        </dd>
        <dt>switched to unaligned</dt>
        <dd>
          {cp.switched_to_unaligned_timestamp
            ? `+${ms(cp.switched_to_unaligned_timestamp - cp.trigger_timestamp)}`
            : "no"}
        </dd>
        <dt>checkpointed size</dt>
        <dd>{bytes(cp.state_size)}</dd>
        <dt>persisted in-flight</dt>
        <dd>{bytes(cp.persisted_data)}</dd>
        <dt>processed</dt>
        <dd>{bytes(cp.processed_data)}</dd>
        <dt>acknowledged</dt>
        <dd>
          {cp.num_acknowledged_subtasks}/{cp.num_subtasks}
        </dd>
      </dl>
      {pending && cp.pending_subtasks.length > 0 && (
        <div class="notice">
          Waiting for {cp.pending_subtasks.length} subtask(s): {cp.pending_subtasks.slice(0, 40).join(", ")}
          {cp.pending_subtasks.length > 40 ? " …" : ""}
        </div>
      )}
      {cp.vertices && cp.vertices.length > 0 && cp.subtasks.length > 0 && (
        <div class="panel">
          <h2>By vertex</h2>
          <VertexSummary vertices={cp.vertices} />
        </div>
      )}
      <div class="panel">
        <h2>Timeline of acks</h2>
        {cp.subtasks.length ? (
          <AckTimeline cp={cp} />
        ) : (
          <Empty>{pending ? "No subtask has acknowledged yet." : "No subtask acknowledged it."}</Empty>
        )}
      </div>
      <div class="panel">
        <h2>Subtasks</h2>
        <p class="legend" hidden={cp.subtasks.length === 0}>
          <span>
            <i class="swatch row-slow" /> slowest (above {OUTLIER}× the median, at most one in ten)
          </span>
          <span>
            <i class="swatch row-large" /> largest channel states (same rule)
          </span>
        </p>
        {cp.subtasks.length > 0 && (
          <table class="data subtasks">
            <thead>
              <tr>
                {th("vertex", "Subtask", false)}
                {th("ack_timestamp", "Acknowledged", false)}
                {th("end_to_end_duration", "End to end")}
                {th("sync_duration", "Sync")}
                {th("async_duration", "Async*")}
                {th("alignment_duration", "Alignment")}
                {th("start_delay", "Start delay")}
                {th("state_size", "State size")}
                {th("processed_data", "Processed")}
                {th("persisted_data", "Persisted (in-flight)")}
                {th("unaligned", "Took it", false)}
              </tr>
            </thead>
            <tbody>
              {rows.slice(offset, offset + ROWS).map((s) => {
                const name = `${s.vertex}[${s.subtask_index}]`;
                const cls = [slow.has(name) ? "row-slow" : "", large.has(name) ? "row-large" : ""].join(" ");
                return (
                  <tr data-subtask={name} class={cls}>
                    <td>
                      {name}
                      {slow.has(name) && <span class="tag tag-slow">slow</span>}
                      {large.has(name) && <span class="tag tag-large">large</span>}
                    </td>
                    <td>
                      {time(s.ack_timestamp)} <span class="muted">+{ms(s.ack_timestamp - cp.trigger_timestamp)}</span>
                    </td>
                    <td class="num">{ms(s.end_to_end_duration)}</td>
                    <td class="num">{ms(s.sync_duration)}</td>
                    <td class="num">{ms(s.async_duration)}</td>
                    <td class="num">{ms(s.alignment_duration)}</td>
                    <td class="num">{ms(s.start_delay)}</td>
                    <td class="num">{bytes(s.state_size)}</td>
                    <td class="num">{bytes(s.processed_data)}</td>
                    <td class="num">{bytes(s.persisted_data)}</td>
                    <td class="took">
                      {s.unaligned ? "unaligned" : s.aligned_over_budget ? "aligned (over the in-flight budget)" : "aligned"}
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        )}
        <Pager
          offset={offset}
          limit={ROWS}
          total={rows.length}
          onChange={setOffset}
          labels={["« First", "‹ Previous", "Next ›", "Last »"]}
        />
        {cp.subtasks.length > 0 && <AsyncNote />}
      </div>
    </section>
  );
}

/** What "async" means here, until subtasks write their state straight to the blob store. */
export function AsyncNote() {
  return (
    <p class="footnote async-note">
      * Async: what a subtask did after its snapshot before sending its acknowledgement. Its state is uploaded in the
      same request as the acknowledgement, so the upload is not in this figure: it is part of the time until the ack
      (the grey part of the timeline), together with, for an aligned barrier, the time the barrier waited behind the
      buffers queued in the subtask's outputs.
    </p>
  );
}

const STATS: [keyof MinMaxAvg, string][] = [
  ["min", "min"],
  ["avg", "avg"],
  ["max", "max"],
];

function VertexSummary({ vertices }: { vertices: VertexCheckpointSummary[] }) {
  const cols: [keyof VertexCheckpointSummary, string, (v: number | null | undefined) => string][] = [
    ["end_to_end_duration", "End to end", ms],
    ["sync_duration", "Sync", ms],
    ["async_duration", "Async*", ms],
    ["alignment_duration", "Alignment", ms],
    ["start_delay", "Start delay", ms],
    ["state_size", "State size", bytes],
    ["processed_data", "Processed", bytes],
    ["persisted_data", "Persisted (in-flight)", bytes],
  ];
  return (
    <table class="data vertex-summary">
      <thead>
        <tr>
          <th>Vertex</th>
          <th>Acknowledged</th>
          <th />
          {cols.map(([, label]) => (
            <th class="num">{label}</th>
          ))}
        </tr>
      </thead>
      <tbody>
        {vertices.flatMap((v) =>
          STATS.map(([stat, label], i) => (
            <tr data-vertex={v.vertex} data-stat={stat} class={i === 0 ? "first-of-vertex" : ""}>
              {i === 0 && <td rowSpan={STATS.length}>{v.vertex}</td>}
              {i === 0 && (
                <td rowSpan={STATS.length}>
                  {v.num_acknowledged_subtasks}/{v.parallelism}
                  {v.num_unaligned ? <div class="muted">{v.num_unaligned} unaligned</div> : null}
                  {v.num_aligned_over_budget ? (
                    <div class="muted">{v.num_aligned_over_budget} aligned over budget</div>
                  ) : null}
                </td>
              )}
              <td class="stat">{label}</td>
              {cols.map(([key, , fmt]) => (
                <td class="num">{fmt((v[key] as MinMaxAvg)[stat])}</td>
              ))}
            </tr>
          )),
        )}
      </tbody>
    </table>
  );
}
