"""Checks that a checkpoint is a consistent cut: state + persisted in-flight records = exactly what was emitted."""

from __future__ import annotations

import pickle
from collections import Counter

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
    return sum(offsets["positions"].values())


def expected_seqs(offsets_by_subtask: dict[int, dict]) -> Counter:
    """Seqs SequenceSource subtasks emitted, given each one's offsets (records per split)."""
    return Counter(
        int(split) + k * o["splits"]
        for o in offsets_by_subtask.values()
        for split, n in o["positions"].items()
        for k in range(n)
    )


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
