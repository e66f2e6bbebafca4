// A checkpoint: its fields, a timeline of acks and the per-subtask table with the slowest and largest highlighted.
import { useEffect, useState } from "preact/hooks";
import { api, call, type SubtaskStats } from "../api/client";
import { AckTimeline } from "../components/AckTimeline";
import { Empty, ErrorView, Link, Pager, StaleBanner, Status, TypeBadge, useData } from "../components/common";
import { bytes, ms, time } from "../format";

const HIGHLIGHT = 3;
const ROWS = 100;
type Key = keyof SubtaskStats;

function top(subtasks: SubtaskStats[], key: (s: SubtaskStats) => number): Set<string> {
  const ranked = subtasks.filter((s) => key(s) > 0).sort((a, b) => key(b) - key(a));
  const n = subtasks.length > HIGHLIGHT ? HIGHLIGHT : Math.min(1, subtasks.length);
  return new Set(ranked.slice(0, n).map((s) => `${s.vertex}[${s.subtask_index}]`));
}

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
  const slow = top(cp.subtasks, (s) => s.end_to_end_duration);
  const large = top(cp.subtasks, (s) => s.persisted_data);
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
          {cp.is_savepoint ? "Savepoint" : "Checkpoint"} #{cp.id} <Status value={cp.status} />{" "}
          <TypeBadge value={cp.is_savepoint ? "savepoint" : cp.checkpoint_type} />
        </h1>
        <div class="actions">
          <Link class="button" href={`/jobs/${jobId}/checkpoints/${cp.id}/in-flight`}>
            In-flight data ({bytes(cp.persisted_data)})
          </Link>
          <button onClick={detail.reload}>Refresh</button>
        </div>
      </header>
      <StaleBanner error={detail.error} retry={detail.reload} />
      {cp.failure_reason && <div class="notice notice-bad">{cp.failure_reason}</div>}
      <dl class="facts">
        <dt>attempt</dt>
        <dd>{cp.attempt}</dd>
        <dt>policy</dt>
        <dd>
          {cp.policy}
          {cp.alignment_timeout !== null ? ` (timeout ${ms(cp.alignment_timeout)})` : ""}
        </dd>
        <dt>triggered</dt>
        <dd>{time(cp.trigger_timestamp)}</dd>
        <dt>completed</dt>
        <dd>{time(cp.completed_timestamp)}</dd>
        <dt>end to end</dt>
        <dd>{ms(cp.end_to_end_duration)}</dd>
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
      {cp.pending_subtasks.length > 0 && (
        <div class="notice">
          Waiting for {cp.pending_subtasks.length} subtask(s): {cp.pending_subtasks.slice(0, 40).join(", ")}
          {cp.pending_subtasks.length > 40 ? " …" : ""}
        </div>
      )}
      <div class="panel">
        <h2>Timeline of acks</h2>
        {cp.subtasks.length ? <AckTimeline cp={cp} /> : <Empty>No subtask has acknowledged yet.</Empty>}
      </div>
      <div class="panel">
        <h2>Subtasks</h2>
        <p class="legend">
          <span>
            <i class="swatch row-slow" /> {HIGHLIGHT} slowest
          </span>
          <span>
            <i class="swatch row-large" /> {HIGHLIGHT} largest channel states
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
                {th("async_duration", "Async")}
                {th("alignment_duration", "Alignment")}
                {th("start_delay", "Start delay")}
                {th("state_size", "State size")}
                {th("processed_data", "Processed")}
                {th("persisted_data", "Persisted (in-flight)")}
                {th("unaligned", "Unaligned", false)}
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
                    <td>{s.unaligned ? "yes" : "no"}</td>
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
      </div>
    </section>
  );
}
