// Jobs: name, status, policy, when created and for how long, current attempt, latest completed checkpoint and its
// age, checkpoint counts.
import { useEffect, useState } from "preact/hooks";
import { ACTIVE_STATUSES, api, call } from "../api/client";
import { Empty, ErrorView, Link, Pager, StaleBanner, Status, useData } from "../components/common";
import { age, ms, time } from "../format";

const LIMIT = 50;

export function JobsPage() {
  const [offset, setOffset] = useState(0);
  const jobs = useData(() => call(api.GET("/api/v1/jobs", { params: { query: { limit: LIMIT, offset } } })), [offset]);
  useEffect(() => {
    const t = setInterval(jobs.reload, 5000);
    return () => clearInterval(t);
  }, [jobs.reload]);
  if (!jobs.data) {
    if (jobs.error) return <ErrorView error={jobs.error} retry={jobs.reload} />;
    return <p class="muted">Loading jobs…</p>;
  }
  const page = jobs.data;
  return (
    <section>
      <h1>Jobs</h1>
      <StaleBanner error={jobs.error} retry={jobs.reload} />
      {page.total === 0 ? (
        <Empty>
          <h2>No jobs yet</h2>
          <p>
            Register a pipeline with the SDK (<code>OvertakeClient.create_job</code>) or run <code>./dev.sh demo</code>;
            it appears here.
          </p>
        </Empty>
      ) : (
        <>
          <table class="data jobs">
            <thead>
              <tr>
                <th>Job</th>
                <th>Status</th>
                <th>Policy</th>
                <th>Created</th>
                <th class="num">Duration</th>
                <th class="num">Attempt</th>
                <th>Latest completed checkpoint</th>
                <th class="num">Completed</th>
                <th class="num">Failed</th>
                <th class="num">In progress</th>
              </tr>
            </thead>
            <tbody>
              {page.items.map((j) => (
                <tr data-job={j.id}>
                  <td>
                    <Link href={`/jobs/${j.id}`}>{j.name}</Link> <span class="muted">#{j.id}</span>
                  </td>
                  <td>
                    <Status value={j.status} />
                  </td>
                  <td class="policy">{j.checkpoint.policy}</td>
                  <td>{time(j.created_at)}</td>
                  <td class="num duration" title={ACTIVE_STATUSES.includes(j.status) ? "so far" : "until it ended"}>
                    {ms((ACTIVE_STATUSES.includes(j.status) ? Date.now() : j.updated_at) - j.created_at)}
                  </td>
                  <td class="num">{j.current_attempt ?? "–"}</td>
                  <td>
                    {j.latest_completed_checkpoint_id ? (
                      <>
                        <Link href={`/jobs/${j.id}/checkpoints/${j.latest_completed_checkpoint_id}`}>
                          #{j.latest_completed_checkpoint_id}
                        </Link>{" "}
                        <span class="muted">{age(j.latest_completed_at)}</span>
                      </>
                    ) : (
                      <span class="muted">none yet</span>
                    )}
                  </td>
                  <td class="num">{j.num_completed}</td>
                  <td
                    class={`num ${j.num_failed ? "bad" : ""}`}
                    title={
                      j.num_not_finished
                        ? `${j.num_not_finished} not finished: the job ended or restarted, or a newer one completed`
                        : undefined
                    }
                  >
                    {j.num_failed}
                  </td>
                  <td class="num">{j.num_in_progress}</td>
                </tr>
              ))}
            </tbody>
          </table>
          <Pager offset={offset} limit={LIMIT} total={page.total} onChange={setOffset} />
        </>
      )}
    </section>
  );
}
