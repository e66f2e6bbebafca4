"""End to end on local Spark with the real coordinator: a slow keyed stage backpressures two sources.

Every checkpoint is checked by decoding what the coordinator stored: operator state plus the persisted in-flight
records must be exactly what the sources had emitted at their offsets (a consistent cut).
"""

from __future__ import annotations

import threading
import time

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin import Pipeline, PipelineError
from spark_plugin.connectors import CollectSink, DiscardSink, SequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.task.channel_state import ChannelStateReader
from tests.spark_plugin.consistency import assert_consistent_cut, cut_of_checkpoint, emitted

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SMALL_BUFFERS = NetworkConfig(buffer_size=1024)
DEEP_QUEUES = NetworkConfig(buffer_size=1024, exclusive_buffers_per_channel=32)
"""Receivers with room for about a thousand records per channel: senders hold no more than their credit plus one
buffer, so this is what makes an alignment at the slow stage take longer than a short alignment timeout."""


def slow_identity(key, record, state):
    time.sleep(0.0003)
    return [record]


def backpressured(name: str, count: int | None = 12_000, sink=None) -> Pipeline:
    p = Pipeline(name, parallelism=2)
    (
        p.source(SequenceSource(count=count, keys=16), id="src")
        .key_by(lambda r: r[0])
        .process(slow_identity, id="slow")
        .sink(sink or CollectSink(), id="out")
    )
    return p


def config(policy: str, interval: int = 300, alignment_timeout: int | None = None) -> CheckpointConfig:
    return CheckpointConfig(
        interval=interval, policy=policy, alignment_timeout=alignment_timeout, retained=1000, timeout=60_000
    )


def completed(client: OvertakeClient, job_id: int) -> list:
    return [c for c in client.list_checkpoints(job_id, limit=1000).items if c.status.value == "COMPLETED"]


def stored_acks(client: OvertakeClient, job_id: int, cid: int) -> dict:
    """What the coordinator holds for checkpoint ``cid``, per subtask, in the shape of the acks."""
    detail = client.get_checkpoint(job_id, cid)
    manifest = {(e.vertex, e.subtask_index): e for e in client.channel_state(job_id, cid).entries}
    acks = {}
    for s in detail.subtasks:
        entry = manifest.get((s.vertex, s.subtask_index))
        acks[(s.vertex, s.subtask_index)] = {
            "operator_state": s.operator_state.model_dump() if s.operator_state else None,
            "channel_state": {"blob_id": entry.blob_id} if entry and entry.segments else None,
            "channel_segments": [seg.model_dump() for seg in entry.segments] if entry else [],
            "source_offsets": s.source_offsets,
        }
    return acks


def persisted_payload(client: OvertakeClient, job_id: int, acks: dict) -> int:
    total = 0
    for ack in acks.values():
        if ack["channel_state"]:
            reader = ChannelStateReader(client.download_blob(job_id, ack["channel_state"]["blob_id"]))
            total += sum(len(b) for seg in ack["channel_segments"] for b in reader.segment_buffers(seg))
    return total


def check_cuts(client: OvertakeClient, job_id: int) -> list[dict]:
    cuts = []
    for cp in completed(client, job_id):
        acks = stored_acks(client, job_id, cp.id)
        cut = cut_of_checkpoint(acks, lambda b: client.download_blob(job_id, b), "out", "src")
        assert_consistent_cut(cut, 2)
        assert cp.persisted_data == persisted_payload(client, job_id, acks)
        cuts.append({"checkpoint": cp, **cut})
    return cuts


def test_unaligned_checkpoints_persist_the_in_flight_buffers_exactly(spark, coordinator):
    result = backpressured("e2e-unaligned").run(
        spark, coordinator.url, checkpoint=config("unaligned"), network=SMALL_BUFFERS
    )
    assert result.status == "finished"
    assert sorted(r[1] for r in result.outputs("out")) == list(range(12_000))
    with OvertakeClient(coordinator.url) as client:
        cuts = check_cuts(client, result.job_id)
    unaligned = [c for c in cuts if c["checkpoint"].checkpoint_type.value == "unaligned"]
    assert len(unaligned) >= 2
    for c in cuts:
        if c not in unaligned:  # taken after the sources finished: acknowledged with final state, nothing in flight
            assert sum(emitted(o) for o in c["emitted"].values()) == 12_000 and not c["input"] and not c["output"]
    assert any(c["input"] or c["output"] for c in cuts), "no unaligned checkpoint persisted in-flight data"
    assert any(c["checkpoint"].persisted_data > 0 for c in cuts)
    # every task runs on this one host, so every ack went through the lowest task's relay
    acked = sum(len(r.acked) for r in result.subtasks)
    assert acked > 0 and sum(r.acks_relayed for r in result.subtasks) == acked
    # and so did their live metrics samples (one a second per subtask, over a run of several checkpoints)
    assert sum(r.metrics_relayed for r in result.subtasks) > 0


def test_aligned_checkpoints_persist_no_channel_state(spark, coordinator):
    result = backpressured("e2e-aligned", count=8_000).run(
        spark, coordinator.url, checkpoint=config("aligned"), network=SMALL_BUFFERS
    )
    assert sorted(r[1] for r in result.outputs("out")) == list(range(8_000))
    with OvertakeClient(coordinator.url) as client:
        cuts = check_cuts(client, result.job_id)
    assert cuts
    for c in cuts:
        assert c["input"] == [] and c["output"] == []
        assert c["checkpoint"].persisted_data == 0
        assert c["checkpoint"].checkpoint_type.value == "aligned"


def test_aligned_then_unaligned_switches_only_after_the_alignment_timeout(spark, coordinator):
    timeout = 150
    result = backpressured("e2e-timeout").run(
        spark, coordinator.url, checkpoint=config("aligned_then_unaligned", 400, timeout), network=DEEP_QUEUES
    )
    logs = [c for s in result.subtasks for c in s.checkpoints if "switched_ms" in c]
    switched = [c for c in logs if c["switched_ms"] is not None]
    assert switched, "no subtask switched to unaligned although alignment was backpressured"
    for c in switched:
        assert c["switched_ms"] >= c["trigger_timestamp"] + timeout, c
    with OvertakeClient(coordinator.url) as client:
        cuts = check_cuts(client, result.job_id)
    assert any(c["checkpoint"].checkpoint_type.value == "unaligned" for c in cuts)


def test_aligned_then_unaligned_with_a_long_timeout_stays_aligned(spark, coordinator):
    result = backpressured("e2e-long-timeout", count=6_000).run(
        spark, coordinator.url, checkpoint=config("aligned_then_unaligned", 400, 50_000), network=SMALL_BUFFERS
    )
    logs = [c for s in result.subtasks for c in s.checkpoints if "switched_ms" in c]
    assert logs and all(c["switched_ms"] is None and not c["unaligned"] for c in logs)
    with OvertakeClient(coordinator.url) as client:
        cuts = check_cuts(client, result.job_id)
    assert cuts and all(c["checkpoint"].persisted_data == 0 for c in cuts)


def test_sources_keep_taking_checkpoints_while_backpressured(spark, coordinator):
    result = backpressured("e2e-source-triggers", count=None, sink=DiscardSink()).run(
        spark, coordinator.url, checkpoint=config("unaligned", 250), network=SMALL_BUFFERS, time_limit=4
    )
    assert result.status == "time limit"
    sources = [s for s in result.subtasks if s.vertex == "src"]
    under_backpressure = [c for s in sources for c in s.checkpoints if c.get("backpressured")]
    assert under_backpressure, "no trigger reached a source while its output was full"
    with OvertakeClient(coordinator.url) as client:
        done = {c.id for c in completed(client, result.job_id)}
    assert {c["checkpoint_id"] for c in under_backpressure} & done


def test_cancelling_the_job_through_the_coordinator_ends_the_run(spark, coordinator):
    client = OvertakeClient(coordinator.url)

    def cancel_after_first_checkpoint():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            jobs = [j for j in client.list_jobs().items if j.name == "e2e-cancel"]
            if jobs and jobs[0].num_completed > 0:
                client.cancel_job(jobs[0].id)
                return
            time.sleep(0.1)

    t = threading.Thread(target=cancel_after_first_checkpoint, daemon=True)
    t.start()
    result = backpressured("e2e-cancel", count=None, sink=DiscardSink()).run(
        spark, coordinator.url, checkpoint=config("unaligned", 200), network=SMALL_BUFFERS, time_limit=60
    )
    t.join(5)
    assert result.status == "job cancelled"
    assert client.get_job(result.job_id).status.value == "CANCELLED"
    client.close()


def test_too_few_spark_slots_is_refused_with_the_local_master_needed(spark):
    p = Pipeline("too-wide", parallelism=7)  # 14 subtasks; the session offers 12 slots
    p.source(SequenceSource(count=10), id="src").rebalance().map(str, id="m").sink(DiscardSink(), id="out")
    with pytest.raises(PipelineError, match=r"needs 14 task slots.*offers 12.*local\[14\]"):
        p.run(spark, "http://127.0.0.1:9")


def test_a_new_attempt_restores_the_latest_unaligned_checkpoint_exactly_once(spark, coordinator):
    first = backpressured("e2e-restore", count=None).run(
        spark, coordinator.url, checkpoint=config("unaligned", 300), network=SMALL_BUFFERS,
        stop_after_checkpoints=2, finish=False,
    )
    assert first.status == "checkpoint limit"
    with OvertakeClient(coordinator.url) as client:
        plan = client.restore_plan(first.job_id)
    assert plan.checkpoint_id is not None
    restored_segments = [s for sub in plan.subtasks for s in sub.input_channel_state + sub.output_channel_state]
    per_source = [emitted(sub.source_offsets) for sub in plan.subtasks if sub.vertex == "src"]
    count = 2 * max(per_source) + 4_000  # the second run's sources stop here; it covers all that was emitted
    second = backpressured("e2e-restore", count=count).run(
        spark, coordinator.url, checkpoint=config("unaligned", 300), network=SMALL_BUFFERS, job_id=first.job_id,
        restore_from="latest",
    )
    assert second.attempt == first.attempt + 1
    assert restored_segments, "the restored checkpoint had no in-flight data to replay"
    seqs = sorted(r[1] for r in second.outputs("out"))
    assert seqs == list(range(count)), f"{len(seqs) - len(set(seqs))} duplicates, {count - len(set(seqs))} missing"


def test_a_bounded_run_into_a_committing_sink_ends_with_a_final_checkpoint(spark, coordinator, tmp_path):
    from spark_plugin.connectors import FileSink

    out = tmp_path / "out"
    result = backpressured("e2e-final", count=6_000, sink=FileSink(str(out))).run(
        spark, coordinator.url, checkpoint=config("unaligned", 500), network=SMALL_BUFFERS
    )
    assert result.status == "finished"
    committed = [line for f in sorted(out.glob("part-*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted(int(line.strip("[]").split(",")[1]) for line in committed) == list(range(6_000))
    assert not list((out / ".pending").iterdir())
