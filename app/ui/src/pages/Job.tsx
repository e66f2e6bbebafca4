// A job: graph with live metrics, the subtasks' live figures, checkpoint config, attempts, history chart and paged
// table, actions that follow the job's state (trigger while it runs; cancel and stop with a savepoint, confirmed), live
// updates from its events.
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import {
  ACTIVE_STATUSES,
  ApiError,
  api,
  call,
  interrupted,
  type AttemptInfo,
  type Checkpoint,
  type CheckpointStatistics,
  type MinMaxAvg,
  type OvertakeEvent,
  type VertexLiveMetrics,
} from "../api/client";
import { followEvents, type StreamState } from "../api/events";
import {
  Empty,
  ErrorView,
  Link,
  Pager,
  StaleBanner,
  Status,
  SubtaskModes,
  TypeBadge,
  askToken,
  confirmAction,
  useData,
} from "../components/common";
import { GraphView } from "../components/GraphView";
import { HistoryChart } from "../components/HistoryChart";
import { LiveSubtasks } from "../components/LiveSubtasks";
import { SourceSplits } from "../components/SourceSplits";
import { age, bytes, count, ms, percentile, time } from "../format";
import { warmUp } from "../warmup";

const LIVE_EVERY = 2000;

const PAGE = 20;
type StatusFilter = "" | "COMPLETED" | "PENDING" | "ABORTED";

export function JobPage({ jobId }: { jobId: number }) {
  const path = { job_id: jobId };
  const job = useData(() => call(api.GET("/api/v1/jobs/{job_id}", { params: { path } })), [jobId]);
  const stats = useData(
    () => call(api.GET("/api/v1/jobs/{job_id}/checkpoints/stats", { params: { path, query: { history: 0 } } })),
    [jobId],
  );
  const [chartSize, setChartSize] = useState(200);
  const chart = useData(
    () => call(api.GET("/api/v1/jobs/{job_id}/checkpoints", { params: { path, query: { limit: chartSize } } })),
    [jobId, chartSize],
  );
  const [offset, setOffset] = useState(0);
  const [filter, setFilter] = useState<StatusFilter>("");
  const history = useData(
    () =>
      call(
        api.GET("/api/v1/jobs/{job_id}/checkpoints", {
          params: { path, query: { limit: PAGE, offset, status: filter || undefined } },
        }),
      ),
    [jobId, offset, filter],
  );
  const attempts = useData(
    () => call(api.GET("/api/v1/jobs/{job_id}/attempts", { params: { path, query: { limit: 20 } } })),
    [jobId],
  );
  const status = job.data?.status;
  const running = status === undefined ? undefined : ACTIVE_STATUSES.includes(status);
  const [live, setLive] = useState<Map<string, VertexLiveMetrics> | undefined>(undefined);
  useEffect(() => {
    if (!running) {
      setLive(undefined);
      return;
    }
    let stopped = false;
    let timer: number | undefined;
    const poll = async () => {
      try {
        const m = await call(api.GET("/api/v1/jobs/{job_id}/metrics", { params: { path } }));
        if (!stopped) setLive(new Map(m.vertices.map((v) => [v.vertex, v])));
      } catch {
        /* the graph keeps the last figures; the banner reports an unreachable coordinator */
      }
      if (!stopped) timer = window.setTimeout(poll, LIVE_EVERY);
    };
    poll();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [jobId, running]);
  const [stream, setStream] = useState<StreamState | "ended">("connecting");
  const [streamKey, setStreamKey] = useState(0); // bumped to reconnect, e.g. after a token was entered
  const [events, setEvents] = useState<OvertakeEvent[]>([]);
  // `whileRunning`: the notice speaks of what the running job will do ("stops once it completes")
  const [notice, setNotice] = useState<{ kind: "ok" | "bad"; text: string; whileRunning?: boolean } | null>(null);
  const reloadAll = useRef<() => void>(() => {});
  reloadAll.current = () => {
    job.reload();
    stats.reload();
    chart.reload();
    history.reload();
    attempts.reload();
  };
  // When the job's status changes (it ended, say), everything else is read again: the event that ended it may have
  // stopped the event stream before its refresh ran, leaving the counts and tables one checkpoint behind the job.
  const seenStatus = useRef(status);
  useEffect(() => {
    const before = seenStatus.current;
    seenStatus.current = status;
    if (before === undefined || status === undefined || before === status) return;
    stats.reload();
    chart.reload();
    history.reload();
    attempts.reload();
    if (!ACTIVE_STATUSES.includes(status))
      setNotice((n) => (n?.whileRunning ? { kind: "ok", text: `The job ended: it is ${status}.` } : n));
  }, [status]);

  useEffect(() => {
    if (running === undefined) return;
    let timer: number | undefined;
    let retry: number | undefined;
    let last = 0;
    let stop = () => {};
    let cancelled = false;
    (async () => {
      let after = 0;
      try {
        const cursor = await call(api.GET("/api/v1/jobs/{job_id}/events/cursor", { params: { path } }));
        after = cursor.latest_event_id;
        const recent = await call(
          api.GET("/api/v1/jobs/{job_id}/events/history", {
            params: { path, query: { after: Math.max(0, after - 8), limit: 8 } },
          }),
        );
        if (!cancelled) setEvents([...recent].reverse());
      } catch (e) {
        if (cancelled) return;
        if (e instanceof ApiError && (e.status === 401 || e.status === 403)) setStream("unauthorized");
        else if (e instanceof ApiError && e.status === 404) setStream("gone");
        else {
          setStream("reconnecting"); // coordinator unreachable: ask again where the log stands, then follow
          retry = window.setTimeout(() => setStreamKey((k) => k + 1), 3000);
        }
        return;
      }
      if (cancelled) return;
      if (!running) {
        setStream("ended"); // an ended job sends no more events worth following
        return;
      }
      stop = followEvents(
        jobId,
        after,
        (e) => {
          setEvents((list) => [e, ...list].slice(0, 8));
          // one refresh for a burst of events, at most one a second
          clearTimeout(timer);
          const wait = Math.max(250, last + 1000 - Date.now());
          timer = window.setTimeout(() => {
            last = Date.now();
            reloadAll.current();
          }, wait);
        },
        setStream,
      );
    })();
    return () => {
      cancelled = true;
      clearTimeout(timer);
      clearTimeout(retry);
      stop();
    };
  }, [jobId, streamKey, running]);

  /** Run a request; on 401/403 ask for the admin token once and run it again. */
  async function withToken<T>(what: string, run: () => Promise<T>): Promise<T | null> {
    try {
      return await run();
    } catch (e) {
      if (!(e instanceof ApiError && (e.status === 401 || e.status === 403))) throw e;
      if (!(await askToken(`${what} needs the admin token. ${e.message}`))) return null;
      const out = await run();
      setStreamKey((k) => k + 1);
      return out;
    }
  }

  async function act(what: string, run: () => Promise<string | null>, whileRunning = false) {
    setNotice(null);
    try {
      const text = await withToken(what, run);
      if (text) setNotice({ kind: "ok", text, whileRunning });
      reloadAll.current();
    } catch (e) {
      setNotice({ kind: "bad", text: e instanceof ApiError ? e.message : String(e) });
    }
  }

  const triggerAction = (savepoint: boolean) =>
    act(savepoint ? "Triggering a savepoint" : "Triggering a checkpoint", async () => {
      const cp: Checkpoint = savepoint
        ? await call(api.POST("/api/v1/jobs/{job_id}/savepoints", { params: { path }, body: { stop: false } }))
        : await call(api.POST("/api/v1/jobs/{job_id}/checkpoints", { params: { path }, body: {} }));
      return `${savepoint ? "Savepoint" : "Checkpoint"} #${cp.id} triggered.`;
    });

  async function stopWithSavepoint() {
    const ok = await confirmAction(
      "Stop the job with a savepoint?",
      "An aligned savepoint is taken; once it completes the job ends as FINISHED, and it can be started again " +
        "from the savepoint.",
      "Stop with savepoint",
    );
    if (!ok) return;
    await act("Stopping with a savepoint", async () => {
      const cp = await call(api.POST("/api/v1/jobs/{job_id}/savepoints", { params: { path }, body: { stop: true } }));
      return `Savepoint #${cp.id} triggered; the job stops once it completes.`;
    }, true);
  }

  async function cancelJob() {
    const ok = await confirmAction(
      "Cancel the job?",
      "Its pending checkpoints are aborted and its subtasks stop. A cancelled job cannot be started again; its " +
        "completed checkpoints and savepoints stay readable.",
      "Cancel job",
      true,
    );
    if (!ok) return;
    await act("Cancelling the job", async () => {
      const j = await call(api.POST("/api/v1/jobs/{job_id}/cancel", { params: { path } }));
      return `Job ${j.name} is ${j.status}.`;
    });
  }

  if (!job.data) {
    if (job.error)
      return (
        <ErrorView
          error={job.error}
          retry={() => {
            reloadAll.current();
            setStreamKey((k) => k + 1);
          }}
          notFound={
            <>
              <h2>Job {jobId} not found</h2>
              <p>
                It may have been removed, or the link is wrong. <Link href="/">See all jobs</Link>.
              </p>
            </>
          }
        />
      );
    return <p class="muted">Loading job {jobId}…</p>;
  }
  const j = job.data;
  const cfg = j.checkpoint;
  const s = stats.data;
  const active = ACTIVE_STATUSES.includes(j.status);
  const hasAttempt = j.current_attempt !== null && j.current_attempt !== undefined;
  const failures = s ? s.counts.failed : j.num_failed;
  const cut = s ? (s.counts.not_finished ?? 0) : (j.num_not_finished ?? 0);
  const chartItems = chart.data ? [...chart.data.items].reverse() : [];
  return (
    <section>
      <p class="crumbs">
        <Link href="/">Jobs</Link> › {j.name}
      </p>
      <header class="page-head">
        <h1>
          {j.name} <span class="muted">#{j.id}</span> <Status value={j.status} />
        </h1>
        <div class="actions">
          <span class={`live live-${stream}`} title="event stream">
            {stream === "live"
              ? "● live"
              : stream === "unauthorized"
                ? "○ events need a token"
                : stream === "ended"
                  ? `○ ended ${age(j.updated_at)}`
                  : `○ ${stream}`}
          </span>
          {active && hasAttempt && (
            <>
              <button class="primary" id="trigger-checkpoint" onClick={() => triggerAction(false)}>
                Trigger checkpoint
              </button>
              <button id="trigger-savepoint" onClick={() => triggerAction(true)}>
                Trigger savepoint
              </button>
              <button id="stop-with-savepoint" onClick={stopWithSavepoint}>
                Stop with savepoint
              </button>
            </>
          )}
          {active && (
            <button class="danger" id="cancel-job" onClick={cancelJob}>
              Cancel job
            </button>
          )}
        </div>
      </header>
      {notice && (
        <div class={`notice notice-${notice.kind}`} role="status">
          {notice.text}
        </div>
      )}
      {j.status_message && (
        <p class="muted status-message">
          <strong class="status-label">
            {!active
              ? `Why it ended (${j.status}):`
              : (j.current_attempt ?? 0) > 1
                ? `Why attempt ${j.current_attempt} started (the job restarted):`
                : "Status:"}
          </strong>{" "}
          <code>{j.status_message}</code>
        </p>
      )}
      {!active && (
        <p class="muted ended-note">
          The job is {j.status}: it takes no more checkpoints. Its history and completed checkpoints stay here.
        </p>
      )}
      {active && !hasAttempt && (
        <p class="muted">No attempt has started yet: checkpoints can be triggered once its runtime starts one.</p>
      )}
      <StaleBanner error={job.error ?? history.error} retry={() => reloadAll.current()} />

      <div class="cards">
        <Card label="Current attempt" value={j.current_attempt ?? "–"} />
        <Card label="Completed" value={count(s?.counts.completed ?? j.num_completed)} />
        <Card
          label="Failed"
          value={count(failures)}
          bad={failures > 0}
          sub={cut ? `+ ${count(cut)} not finished (the job ended or restarted, or a newer one completed)` : undefined}
        />
        <Card label="In progress" value={count(s?.counts.in_progress ?? j.num_in_progress)} />
        <Card label="Savepoints" value={count(s?.counts.savepoints ?? 0)} />
        <Card
          label="Latest completed"
          value={j.latest_completed_checkpoint_id ? `#${j.latest_completed_checkpoint_id}` : "–"}
          sub={age(j.latest_completed_at)}
        />
        <SteadyTile items={chartItems} complete={!!chart.data && chart.data.items.length >= chart.data.total} />
        <Card label="Persisted in-flight, max" value={bytes(s?.summary.persisted_data.max)} />
      </div>

      <div class="two-col">
        <div class="panel">
          <h2>Graph</h2>
          <div class="graph-wrap">
            <GraphView graph={j.graph} live={live} />
          </div>
          {active && (
            <p class="footnote">
              Live: records taken per second and backpressure (the busiest subtask's share of time waiting for room in
              its outputs: green up to 10%, amber up to 50%, red above), and the low watermark with how far it trails
              the wall clock, as the subtasks report them every second.
            </p>
          )}
        </div>
        <div class="panel config">
          <h2>Checkpoint config</h2>
          <dl>
            <dt>interval</dt>
            <dd>{cfg.interval ? ms(cfg.interval) : "manual only"}</dd>
            <dt>policy</dt>
            <dd>
              {cfg.policy}
              {cfg.policy === "aligned_then_unaligned" &&
              cfg.alignment_timeout !== null &&
              cfg.alignment_timeout !== undefined
                ? ` (switch after ${ms(cfg.alignment_timeout)})`
                : ""}
              {cfg.policy === "adaptive"
                ? ` (chooses per checkpoint; alignment budget ${ms(cfg.alignment_timeout ?? Math.min(1000, Math.floor(cfg.timeout / 2)))})`
                : ""}
            </dd>
            <dt>timeout</dt>
            <dd>{ms(cfg.timeout)}</dd>
            <dt>min pause</dt>
            <dd>{ms(cfg.min_pause)}</dd>
            <dt>max concurrent</dt>
            <dd>{cfg.max_concurrent}</dd>
            <dt>tolerable failures</dt>
            <dd>{cfg.tolerable_failures}</dd>
            <dt>retained</dt>
            <dd>{cfg.retained}</dd>
          </dl>
        </div>
      </div>

      {active && live && (
        <div class="panel">
          <h2>Subtasks</h2>
          <LiveSubtasks live={live} />
        </div>
      )}
      {active && live && <SourceSplits live={live} />}

      {attempts.data && attempts.data.items.length > 0 && (
        <div class="panel">
          <h2>Attempts</h2>
          <AttemptsTable jobId={jobId} items={attempts.data.items} graph={j.graph} />
        </div>
      )}

      <div class="panel">
        <div class="panel-head">
          <h2>History</h2>
          <label>
            show the last{" "}
            <select value={chartSize} onChange={(e) => setChartSize(Number((e.target as HTMLSelectElement).value))}>
              {[50, 200, 1000].map((n) => (
                <option value={n}>{n}</option>
              ))}
            </select>{" "}
            checkpoints
          </label>
        </div>
        {chart.data && chart.data.total > 0 ? (
          <HistoryChart
            jobId={jobId}
            checkpoints={chartItems}
            warm={warmUp(chartItems, chart.data.items.length >= chart.data.total)}
          />
        ) : chart.data ? (
          <Empty>
            <p>
              {active
                ? "No checkpoints yet. Trigger one with the button above, or set an interval."
                : `No checkpoints: the job is ${j.status}.`}
            </p>
          </Empty>
        ) : null}
        <AdaptiveCount items={chartItems} />
        {s && s.counts.completed > 0 && <JobSummary summary={s.summary} completed={s.counts.completed} />}
      </div>

      <div class="panel">
        <div class="panel-head">
          <h2>Checkpoints</h2>
          <label>
            status{" "}
            <select
              value={filter}
              onChange={(e) => {
                setFilter((e.target as HTMLSelectElement).value as StatusFilter);
                setOffset(0);
              }}
            >
              <option value="">all</option>
              <option value="COMPLETED">completed</option>
              <option value="PENDING">in progress</option>
              <option value="ABORTED">failed</option>
            </select>
          </label>
        </div>
        {history.data && <HistoryTable jobId={jobId} items={history.data.items} />}
        {history.data && history.data.total === 0 && (
          <Empty>
            <p>{filter ? "No checkpoints with this status." : "No checkpoints yet."}</p>
          </Empty>
        )}
        {history.data && <Pager offset={offset} limit={PAGE} total={history.data.total} onChange={setOffset} />}
      </div>

      <div class="panel">
        <h2>Recent events</h2>
        {events.length === 0 ? (
          <p class="muted">No events received yet.</p>
        ) : (
          <ul class="events">
            {events.map((e) => (
              <li data-event={e.type}>
                <span class="muted">{time(e.timestamp)}</span> <code>{e.type}</code> {describe(e)}
              </li>
            ))}
          </ul>
        )}
      </div>
    </section>
  );
}

function describe(e: OvertakeEvent): string {
  const d = e.data as Record<string, unknown>;
  const parts = [];
  if (d.checkpoint_id !== undefined) parts.push(`#${d.checkpoint_id}`);
  if (d.attempt !== undefined) parts.push(`attempt ${d.attempt}`);
  if (d.status !== undefined) parts.push(String(d.status));
  if (d.reason) parts.push(String(d.reason));
  return parts.join(" · ");
}

function Card({ label, value, sub, bad }: { label: string; value: string | number; sub?: string; bad?: boolean }) {
  return (
    <div class={`card ${bad ? "bad" : ""}`}>
      <div class="card-label">{label}</div>
      <div class="card-value">{value}</div>
      {sub && <div class="card-sub muted">{sub}</div>}
    </div>
  );
}

/** End-to-end p50 / p99 of the loaded checkpoints after warm-up (each attempt's first completed one and those
 * before it waited for its tasks to start). */
function SteadyTile({ items, complete }: { items: Checkpoint[]; complete: boolean }) {
  const figures = useMemo(() => {
    const warm = warmUp(items, complete);
    const values = items
      .filter((c) => c.status === "COMPLETED" && !c.is_savepoint && !warm.has(c.id))
      .map((c) => c.end_to_end_duration ?? 0)
      .sort((a, b) => a - b);
    return { p50: percentile(values, 0.5), p99: percentile(values, 0.99), n: values.length, warm: warm.size };
  }, [items, complete]);
  return (
    <Card
      label="End-to-end p50 / p99"
      value={`${ms(figures.p50)} / ${ms(figures.p99)}`}
      sub={`${figures.n} checkpoint${figures.n === 1 ? "" : "s"}${figures.warm ? " after warm-up" : ""}`}
    />
  );
}

/** How often the adaptive policy chose each barrier policy among the charted checkpoints. */
function AdaptiveCount({ items }: { items: Checkpoint[] }) {
  const chosen = new Map<string, number>();
  for (const c of items) if (c.decision) chosen.set(c.decision.chosen, (chosen.get(c.decision.chosen) ?? 0) + 1);
  if (chosen.size === 0) return null;
  const decided = [...chosen.values()].reduce((a, b) => a + b, 0);
  return (
    <p class="adaptive-count">
      The adaptive policy decided {decided} of these {items.length} checkpoints:{" "}
      {[...chosen.entries()].map(([policy, n]) => `${n} ${policy}`).join(", ")}.
    </p>
  );
}

/** Min / avg / max of the job's completed checkpoints, as `overtake checkpoints stats` prints them. */
function JobSummary({ summary, completed }: { summary: CheckpointStatistics["summary"]; completed: number }) {
  const rows: [string, MinMaxAvg, (v: number | null | undefined) => string][] = [
    ["End to end", summary.end_to_end_duration, ms],
    ["Checkpointed size", summary.state_size, bytes],
    ["Persisted in-flight", summary.persisted_data, bytes],
    ["Processed", summary.processed_data, bytes],
    ["Alignment", summary.alignment_duration, ms],
  ];
  return (
    <table class="data job-summary">
      <caption>
        {count(completed)} completed checkpoint{completed === 1 ? "" : "s"} (savepoints and warm-up included)
      </caption>
      <thead>
        <tr>
          <th />
          <th class="num">min</th>
          <th class="num">avg</th>
          <th class="num">max</th>
        </tr>
      </thead>
      <tbody>
        {rows.map(([label, mma, fmt]) => (
          <tr data-figure={label}>
            <td>{label}</td>
            <td class="num">{fmt(mma.min)}</td>
            <td class="num">{fmt(mma.avg)}</td>
            <td class="num">{fmt(mma.max)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** An attempt's recovery phases; what the coordinator does not know is left out. */
function Phases({ phases }: { phases: AttemptInfo["phases"] }) {
  if (!phases) return <>–</>;
  const parts: [string, number | null | undefined][] = [
    ["detect", phases.detect_ms],
    ["relaunch", phases.relaunch_ms],
    ["restore", phases.restore_ms],
    ["replay", phases.replay_ms],
  ];
  return (
    <>
      {parts
        .filter(([, v]) => v !== null && v !== undefined)
        .map(([name, v]) => (
          <div data-phase={name}>
            {name} {ms(v)}
          </div>
        ))}
      {phases.replaying ? <div class="replaying">{phases.replaying} subtasks replaying</div> : null}
    </>
  );
}

function AttemptsTable({
  jobId,
  items,
  graph,
}: {
  jobId: number;
  items: AttemptInfo[];
  graph: { vertices: { id: string; parallelism: number }[] };
}) {
  return (
    <table class="data attempts">
      <thead>
        <tr>
          <th class="num">Attempt</th>
          <th>Started</th>
          <th>Ended</th>
          <th>Restored from</th>
          <th>Passed over</th>
          <th>Rescaled</th>
          <th title="the current attempt's recovery: noticing the failure, launching the tasks, the longest restore, replaying in-flight data">
            Recovery
          </th>
          <th>Why it ended</th>
        </tr>
      </thead>
      <tbody>
        {items.map(({ fallbacks = [], rescaled = [], ...a }) => (
          <tr data-attempt={a.attempt}>
            <td class="num">{a.attempt}</td>
            <td>{time(a.started_at)}</td>
            <td>{a.ended_at ? time(a.ended_at) : <span class="muted">current</span>}</td>
            <td class="restored">
              {a.restored_checkpoint_id !== null && a.restored_checkpoint_id !== undefined ? (
                <>
                  {a.restored_is_savepoint ? "savepoint " : "checkpoint "}
                  <Link href={`/jobs/${jobId}/checkpoints/${a.restored_checkpoint_id}`}>
                    #{a.restored_checkpoint_id}
                  </Link>
                </>
              ) : (
                <span class="muted">fresh start</span>
              )}
            </td>
            <td class={fallbacks.length ? "fallback" : ""}>
              {fallbacks.length ? (
                fallbacks.map((f) => (
                  <div>
                    <Link href={`/jobs/${jobId}/checkpoints/${f.checkpoint_id}`}>#{f.checkpoint_id}</Link>: {f.reason}
                  </div>
                ))
              ) : a.recorded ? (
                "–"
              ) : (
                <span class="muted">not recorded (older than the event log)</span>
              )}
            </td>
            <td class="rescaled">
              {rescaled.length
                ? rescaled.map((r) => (
                    <div>
                      {r.vertex}: {r.old_parallelism} → {r.new_parallelism}
                      {r.channel_state_bytes ? ` (${bytes(r.channel_state_bytes)} in flight redistributed)` : ""}
                    </div>
                  ))
                : "–"}
            </td>
            <td class="phases">
              <Phases phases={a.phases} />
            </td>
            <td class="end-reason">
              {a.end_reason ? (
                <code>{a.end_reason}</code>
              ) : a.ended_at ? (
                <span class="muted">not said</span>
              ) : (
                <span class="muted">running</span>
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function HistoryTable({ jobId, items }: { jobId: number; items: Checkpoint[] }) {
  if (items.length === 0) return null;
  return (
    <table class="data history">
      <thead>
        <tr>
          <th class="num">ID</th>
          <th>Status</th>
          <th>Type</th>
          <th>Triggered</th>
          <th>Latest ack</th>
          <th class="num">End to end</th>
          <th class="num">Checkpointed size</th>
          <th class="num">Processed</th>
          <th class="num">Persisted (in-flight)</th>
          <th class="num">Alignment</th>
          <th
            class="num"
            title="trigger to a subtask's first barrier (the longest): an aligned barrier's wait behind queued buffers"
          >
            Start delay
          </th>
          <th class="num">Acknowledged</th>
          <th>Note</th>
        </tr>
      </thead>
      <tbody>
        {items.map((c) => (
          <tr
            data-checkpoint={c.id}
            class={interrupted(c) ? "row-interrupted" : c.status === "ABORTED" ? "row-bad" : ""}
          >
            <td class="num">
              <Link href={`/jobs/${jobId}/checkpoints/${c.id}`}>#{c.id}</Link>
            </td>
            <td>
              {interrupted(c) ? (
                <span
                  class="badge status-interrupted"
                  title="aborted because the job ended or restarted, or a newer checkpoint completed: not a failure"
                >
                  NOT FINISHED
                </span>
              ) : (
                <Status value={c.status} />
              )}
            </td>
            <td>
              <TypeBadge value={c.is_savepoint ? "savepoint" : c.checkpoint_type} />
              <div>
                <SubtaskModes modes={c.subtask_modes} />
              </div>
            </td>
            <td>{time(c.trigger_timestamp)}</td>
            <td>{time(c.latest_ack_timestamp)}</td>
            <td class="num">{ms(c.end_to_end_duration)}</td>
            <td class="num">{bytes(c.state_size)}</td>
            <td class="num">{bytes(c.processed_data)}</td>
            <td class="num">
              {c.persisted_data && c.status === "COMPLETED" && !c.discarded ? (
                <Link href={`/jobs/${jobId}/checkpoints/${c.id}/in-flight`}>{bytes(c.persisted_data)}</Link>
              ) : (
                bytes(c.persisted_data)
              )}
            </td>
            <td class="num">{ms(c.alignment_duration)}</td>
            <td class="num start-delay">{ms(c.start_delay)}</td>
            <td class="num">
              {c.num_acknowledged_subtasks}/{c.num_subtasks}
            </td>
            <td class="note">
              {c.decision ? (
                <div class="decision-note">
                  adaptive chose {c.decision.chosen}: {c.decision.reason}
                </div>
              ) : null}
              {c.failure_reason ??
                (c.discarded
                  ? "state deleted (retention)"
                  : c.switched_to_unaligned_timestamp
                    ? `switched to unaligned +${ms(c.switched_to_unaligned_timestamp - c.trigger_timestamp)}`
                    : "")}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
