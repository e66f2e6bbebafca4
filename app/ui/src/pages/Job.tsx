// A job: graph, checkpoint config, history chart and paged table, trigger buttons, live updates from its events.
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, api, call, type Checkpoint, type OvertakeEvent } from "../api/client";
import { followEvents, type StreamState } from "../api/events";
import { Empty, ErrorView, Link, Pager, StaleBanner, Status, TypeBadge, askToken, useData } from "../components/common";
import { GraphView } from "../components/GraphView";
import { HistoryChart } from "../components/HistoryChart";
import { age, bytes, count, ms, time } from "../format";

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
  const [stream, setStream] = useState<StreamState>("connecting");
  const [streamKey, setStreamKey] = useState(0); // bumped to reconnect, e.g. after a token was entered
  const [events, setEvents] = useState<OvertakeEvent[]>([]);
  const [notice, setNotice] = useState<{ kind: "ok" | "bad"; text: string } | null>(null);
  const reloadAll = useRef<() => void>(() => {});
  reloadAll.current = () => {
    job.reload();
    stats.reload();
    chart.reload();
    history.reload();
  };

  useEffect(() => {
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
  }, [jobId, streamKey]);

  async function triggerAction(savepoint: boolean) {
    setNotice(null);
    const run = () =>
      savepoint
        ? call(api.POST("/api/v1/jobs/{job_id}/savepoints", { params: { path }, body: { stop: false } }))
        : call(api.POST("/api/v1/jobs/{job_id}/checkpoints", { params: { path }, body: {} }));
    try {
      let cp: Checkpoint;
      try {
        cp = await run();
      } catch (e) {
        if (!(e instanceof ApiError && (e.status === 401 || e.status === 403))) throw e;
        const what = savepoint ? "a savepoint" : "a checkpoint";
        if (!(await askToken(`Triggering ${what} needs the admin token. ${e.message}`))) return;
        cp = await run();
        setStreamKey((k) => k + 1);
      }
      setNotice({ kind: "ok", text: `${savepoint ? "Savepoint" : "Checkpoint"} #${cp.id} triggered.` });
      reloadAll.current();
    } catch (e) {
      setNotice({ kind: "bad", text: e instanceof ApiError ? e.message : String(e) });
    }
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
            {stream === "live" ? "● live" : stream === "unauthorized" ? "○ events need a token" : `○ ${stream}`}
          </span>
          <button class="primary" id="trigger-checkpoint" onClick={() => triggerAction(false)}>
            Trigger checkpoint
          </button>
          <button id="trigger-savepoint" onClick={() => triggerAction(true)}>
            Trigger savepoint
          </button>
        </div>
      </header>
      {notice && (
        <div class={`notice notice-${notice.kind}`} role="status">
          {notice.text}
        </div>
      )}
      {j.status_message && <p class="muted">{j.status_message}</p>}
      <StaleBanner error={job.error ?? history.error} retry={() => reloadAll.current()} />

      <div class="cards">
        <Card label="Current attempt" value={j.current_attempt ?? "–"} />
        <Card label="Completed" value={count(s?.counts.completed ?? j.num_completed)} />
        <Card label="Failed" value={count(s?.counts.failed ?? j.num_failed)} bad={(s?.counts.failed ?? 0) > 0} />
        <Card label="In progress" value={count(s?.counts.in_progress ?? j.num_in_progress)} />
        <Card label="Savepoints" value={count(s?.counts.savepoints ?? 0)} />
        <Card
          label="Latest completed"
          value={j.latest_completed_checkpoint_id ? `#${j.latest_completed_checkpoint_id}` : "–"}
          sub={age(j.latest_completed_at)}
        />
        <Card
          label="End-to-end p50 / p99"
          value={`${ms(s?.summary.end_to_end_duration.p50)} / ${ms(s?.summary.end_to_end_duration.p99)}`}
        />
        <Card label="Persisted in-flight, max" value={bytes(s?.summary.persisted_data.max)} />
      </div>

      <div class="two-col">
        <div class="panel">
          <h2>Graph</h2>
          <div class="graph-wrap">
            <GraphView graph={j.graph} />
          </div>
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
          <HistoryChart jobId={jobId} checkpoints={[...chart.data.items].reverse()} />
        ) : chart.data ? (
          <Empty>
            <p>No checkpoints yet. Trigger one with the button above, or set an interval.</p>
          </Empty>
        ) : null}
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
          <th class="num">Acknowledged</th>
          <th>Note</th>
        </tr>
      </thead>
      <tbody>
        {items.map((c) => (
          <tr data-checkpoint={c.id} class={c.status === "ABORTED" ? "row-bad" : ""}>
            <td class="num">
              <Link href={`/jobs/${jobId}/checkpoints/${c.id}`}>#{c.id}</Link>
            </td>
            <td>
              <Status value={c.status} />
            </td>
            <td>
              <TypeBadge value={c.is_savepoint ? "savepoint" : c.checkpoint_type} />
            </td>
            <td>{time(c.trigger_timestamp)}</td>
            <td>{time(c.latest_ack_timestamp)}</td>
            <td class="num">{ms(c.end_to_end_duration)}</td>
            <td class="num">{bytes(c.state_size)}</td>
            <td class="num">{bytes(c.processed_data)}</td>
            <td class="num">
              {c.persisted_data ? (
                <Link href={`/jobs/${jobId}/checkpoints/${c.id}/in-flight`}>{bytes(c.persisted_data)}</Link>
              ) : (
                "0 B"
              )}
            </td>
            <td class="num">{ms(c.alignment_duration)}</td>
            <td class="num">
              {c.num_acknowledged_subtasks}/{c.num_subtasks}
            </td>
            <td class="note">
              {c.failure_reason ??
                (c.discarded
                  ? "discarded (retention)"
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
