"""Checks that a checkpoint is a consistent cut: state + persisted in-flight records = exactly what was emitted."""

from __future__ import annotations

import pickle
from collections import Counter

from spark_plugin.connectors.sequence import SequenceSource
from spark_plugin.task.channel_state import ChannelStateReader


def cut_of_checkpoint(acks: dict, blob: callable, sink_id: str, source_vertex: str) -> dict:
    """Decode one checkpoint of a ``source -> ... -> sink collecting (key, seq)`` pipeline.

    ``acks`` maps ``(vertex, subtask) -> ack dict``; ``blob(blob_id) -> bytes``. Returns the seqs in the sinks'
    state, in input and output channel state, and the seqs the sources had emitted (from their offsets).
    """
    in_sink: list[int] = []
    input_state: list[int] = []
    output_state: list[int] = []
    emitted_by_source: dict[int, dict] = {}
    for (vertex, index), ack in acks.items():
        op = ack.get("operator_state")
        if op:
            states = pickle.loads(blob(op["blob_id"]))["operators"]
            if sink_id in states and states[sink_id] is not None:
                in_sink.extend(r[1] for r in states[sink_id]["records"])
        ch = ack.get("channel_state")
        if ch:
            reader = ChannelStateReader(blob(ch["blob_id"]))
            for seg in ack["channel_segments"]:
                seqs = [r[1] for r in reader.segment_records(seg)]
                (input_state if seg["direction"] == "input" else output_state).extend(seqs)
        if vertex == source_vertex:
            emitted_by_source[index] = ack["source_offsets"]
    return {
        "sink": in_sink,
        "input": input_state,
        "output": output_state,
        "emitted": emitted_by_source,
    }


def emitted(offsets: dict) -> int:
    """How many records a SequenceSource subtask had emitted, from its offsets."""
    return sum(SequenceSource.emitted_per_split(offsets).values())


def expected_seqs(offsets_by_subtask: dict[int, dict]) -> Counter:
    """Seqs SequenceSource subtasks emitted, given each one's offsets (records per split)."""
    return Counter(seq for o in offsets_by_subtask.values() for seq in SequenceSource.seqs_emitted(o))


def assert_consistent_cut(cut: dict, source_parallelism: int | None = None) -> None:
    """Every emitted record is exactly once in the sink state or in the persisted in-flight data."""
    got = Counter(cut["sink"]) + Counter(cut["input"]) + Counter(cut["output"])
    want = expected_seqs(cut["emitted"])
    missing = want - got
    extra = got - want
    assert not missing and not extra, (
        f"not a consistent cut: {sum(missing.values())} records missing (e.g. {sorted(missing)[:5]}), "
        f"{sum(extra.values())} extra (e.g. {sorted(extra)[:5]})"
    )


def flat_cut_of_checkpoint(acks: dict, blob: callable, sink_id: str, source_vertex: str) -> dict:
    """Decode one checkpoint of a ``source -> flat_map -> ... -> sink`` pipeline whose flat_map turns each ``(key,
    seq)`` or ``(key, seq, payload)`` into ``(key, seq, j)`` for ``j`` in ``range(fanout)``: what the sinks hold, the source records and the
    flat_map outputs persisted as channel state (each with the vertex and direction that persisted it), the bytes
    persisted per ``(vertex, direction)``, and the sources' offsets."""
    in_sink: list[tuple[int, int]] = []
    persisted_sources: list[int] = []
    persisted_outputs: list[tuple[int, int]] = []
    where: dict[str, set[tuple[str, str]]] = {"source records": set(), "flat_map outputs": set()}
    persisted_bytes: Counter = Counter()
    emitted_by_source: dict[int, dict] = {}
    for (vertex, index), ack in acks.items():
        op = ack.get("operator_state")
        if op:
            states = pickle.loads(blob(op["blob_id"]))["operators"]
            if sink_id in states and states[sink_id] is not None:
                in_sink.extend((r[1], r[2]) for r in states[sink_id]["records"])
        ch = ack.get("channel_state")
        if ch:
            reader = ChannelStateReader(blob(ch["blob_id"]))
            for seg in ack["channel_segments"]:
                persisted_bytes[(vertex, seg["direction"])] += seg["length"]
                for r in reader.segment_records(seg):
                    if len(r) == 2 or isinstance(r[2], str):
                        persisted_sources.append(r[1])
                        where["source records"].add((vertex, seg["direction"]))
                    else:
                        persisted_outputs.append((r[1], r[2]))
                        where["flat_map outputs"].add((vertex, seg["direction"]))
        if vertex == source_vertex:
            emitted_by_source[index] = ack["source_offsets"]
    return {
        "sink": in_sink,
        "sources": persisted_sources,
        "outputs": persisted_outputs,
        "where": where,
        "bytes": persisted_bytes,
        "emitted": emitted_by_source,
    }


def assert_consistent_flat_cut(cut: dict, fanout: int) -> None:
    """Every output the flat_map owes for the emitted records is exactly once in the sink state, among the persisted
    flat_map outputs, or implied by a persisted source record (which the flat_map turns into ``fanout`` outputs on
    replay)."""
    got = Counter(cut["sink"]) + Counter(cut["outputs"])
    got += Counter((seq, j) for seq in cut["sources"] for j in range(fanout))
    want = Counter((seq, j) for seq in expected_seqs(cut["emitted"]).elements() for j in range(fanout))
    missing = want - got
    extra = got - want
    assert not missing and not extra, (
        f"not a consistent cut: {sum(missing.values())} outputs missing (e.g. {sorted(missing)[:5]}), "
        f"{sum(extra.values())} extra (e.g. {sorted(extra)[:5]})"
    )
