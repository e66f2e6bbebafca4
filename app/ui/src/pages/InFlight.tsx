// In-flight data of a checkpoint: its channel-state segments by channel, and a preview of a segment's records.
import { useEffect, useRef, useState } from "preact/hooks";
// The length written before each buffer of a channel-state segment (contract/channel_state.py, FRAME).
const FRAME_BYTES = 4;
import { api, call, type ChannelSegment, type SegmentPreview } from "../api/client";
import { Empty, ErrorView, Link, useData } from "../components/common";
import { bytes, count, time } from "../format";

type Picked = { vertex: string; subtask_index: number; segment: ChannelSegment };

export function InFlightPage({ jobId, cpId }: { jobId: number; cpId: number }) {
  const path = { job_id: jobId, checkpoint_id: cpId };
  const manifest = useData(
    () => call(api.GET("/api/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/channel-state", { params: { path } })),
    [jobId, cpId],
  );
  const [picked, setPicked] = useState<Picked | null>(null);
  const crumbs = (
    <p class="crumbs">
      <Link href="/">Jobs</Link> › <Link href={`/jobs/${jobId}`}>job {jobId}</Link> ›{" "}
      <Link href={`/jobs/${jobId}/checkpoints/${cpId}`}>checkpoint {cpId}</Link> › in-flight data
    </p>
  );
  if (!manifest.data) {
    if (manifest.error)
      return (
        <>
          {crumbs}
          <ErrorView
            error={manifest.error}
            retry={manifest.reload}
            notFound={
              <h2>
                Checkpoint {cpId} of job {jobId} not found
              </h2>
            }
          />
        </>
      );
    return <p class="muted">Loading channel state…</p>;
  }
  const rows = manifest.data.entries.flatMap((e) =>
    e.segments.map((segment) => ({ vertex: e.vertex, subtask_index: e.subtask_index, segment })),
  );
  rows.sort(
    (a, b) =>
      a.segment.channel.localeCompare(b.segment.channel) || a.segment.direction.localeCompare(b.segment.direction),
  );
  const total = rows.reduce((a, r) => a + r.segment.length, 0);
  // the checkpoint counts the buffers' bytes; a segment stores each buffer after its 4-byte length (the channel-state
  // format's frame), so both figures are said: the first is the one the checkpoint's pages show
  const buffers = rows.reduce((a, r) => a + r.segment.buffer_count, 0);
  const payload = total - FRAME_BYTES * buffers;
  const records = rows.reduce((a, r) => a + r.segment.record_count, 0);
  const largest = Math.max(1, ...rows.map((r) => r.segment.length));
  const m = manifest.data;
  return (
    <section>
      {crumbs}
      <h1>In-flight data of checkpoint #{cpId}</h1>
      {m.deleted && (
        <div class="notice deleted-notice" role="status">
          {m.deleted_reason === "retention"
            ? "This in-flight data was deleted by retention"
            : "This in-flight data was deleted when the checkpoint was aborted"}
          {m.deleted_at ? ` at ${time(m.deleted_at)}` : ""}
          {m.deleted_reason === "retention"
            ? ": the job keeps only its newest completed checkpoints (its 'retained' setting) and savepoints."
            : "."}{" "}
          The segments below are what the checkpoint recorded; their records can no longer be read.
        </div>
      )}
      {rows.length === 0 ? (
        <Empty>
          <h2>No in-flight data</h2>
          <p>
            No subtask persisted channel state for this checkpoint: it ran aligned, no buffer was in flight when its
            barriers passed, or its blobs were collected.
          </p>
        </Empty>
      ) : (
        <>
          <p class="muted">
            {rows.length} segment(s) of {manifest.data.entries.length} subtask(s):{" "}
            <span class="inflight-payload">{bytes(payload)}</span> in {count(buffers)} buffer(s) ({bytes(total)} stored,
            with each buffer's 4-byte length), {count(records)} record(s).
          </p>
          <table class="data segments">
            <thead>
              <tr>
                <th>Channel</th>
                <th>Direction</th>
                <th>Subtask</th>
                <th>Peer</th>
                <th>Partitioning</th>
                <th class="num">Buffers</th>
                <th class="num">Records</th>
                <th class="num">Bytes</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {rows.map((r) => {
                const key = `${r.vertex}[${r.subtask_index}] ${r.segment.direction} ${r.segment.channel}`;
                const on =
                  picked &&
                  `${picked.vertex}[${picked.subtask_index}] ${picked.segment.direction} ${picked.segment.channel}` ===
                    key;
                return (
                  <tr data-channel={r.segment.channel} class={on ? "picked" : ""}>
                    <td>
                      <code>{r.segment.channel}</code>
                    </td>
                    <td>{r.segment.direction}</td>
                    <td>{`${r.vertex}[${r.subtask_index}]`}</td>
                    <td>
                      {r.segment.peer_vertex ? `${r.segment.peer_vertex}[${r.segment.peer_subtask ?? "?"}]` : "–"}
                    </td>
                    <td>{r.segment.partitioning ?? "–"}</td>
                    <td class="num">{r.segment.buffer_count}</td>
                    <td class="num">{count(r.segment.record_count)}</td>
                    <td class="num bytes-cell">
                      <span class="bytes-bar" style={{ width: `${(100 * r.segment.length) / largest}%` }} />
                      <span>{bytes(r.segment.length)}</span>
                    </td>
                    <td>
                      {!m.deleted && (
                        <button class="small" onClick={() => setPicked(r)}>
                          Preview
                        </button>
                      )}
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
          {picked && <Preview jobId={jobId} cpId={cpId} picked={picked} />}
        </>
      )}
    </section>
  );
}

function Preview({ jobId, cpId, picked }: { jobId: number; cpId: number; picked: Picked }) {
  const preview = useData<SegmentPreview>(
    () =>
      call(
        api.GET("/api/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/channel-state/preview", {
          params: {
            path: { job_id: jobId, checkpoint_id: cpId },
            query: {
              vertex: picked.vertex,
              subtask_index: picked.subtask_index,
              channel: picked.segment.channel,
              direction: picked.segment.direction,
              max_records: 100,
            },
          },
        }),
      ),
    [jobId, cpId, picked],
  );
  const ref = useRef<HTMLDivElement>(null);
  useEffect(() => ref.current?.scrollIntoView({ block: "nearest" }), [picked, preview.data]);
  return (
    <div class="panel preview" id="preview" ref={ref}>
      <h2>
        Records of <code>{picked.segment.channel}</code> ({picked.segment.direction}, {picked.vertex}[
        {picked.subtask_index}])
      </h2>
      {preview.error && (
        <ErrorView
          error={preview.error}
          retry={preview.reload}
          notFound={<h3>This segment can no longer be read</h3>}
        />
      )}
      {!preview.data && !preview.error && <p class="muted">Decoding…</p>}
      {preview.data && (
        <>
          <p class="muted">
            Showing {preview.data.records.length} of {count(preview.data.record_count)} record(s)
            {preview.data.truncated ? " (the preview is limited)" : ""}; read {bytes(preview.data.bytes_read)} of{" "}
            {bytes(preview.data.segment_length)}. Records are decoded on the coordinator with a restricted unpickler;
            types outside its allow-list are shown as hex.
          </p>
          {preview.data.records.length === 0 ? (
            <Empty>This segment holds no records.</Empty>
          ) : (
            <table class="data records">
              <thead>
                <tr>
                  <th class="num">#</th>
                  <th class="num">Buffer</th>
                  <th>Type</th>
                  <th>Record</th>
                  <th class="num">Bytes</th>
                </tr>
              </thead>
              <tbody>
                {preview.data.records.map((r) => (
                  <tr class={`record-${r.status}`}>
                    <td class="num">{r.index}</td>
                    <td class="num">{r.buffer}</td>
                    <td>{r.type ?? <span class="badge status-aborted">{r.status}</span>}</td>
                    <td class="record">
                      <code>{r.text}</code>
                      {r.hex && <div class="hex">{r.hex}</div>}
                    </td>
                    <td class="num">{r.size}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </>
      )}
    </div>
  );
}
