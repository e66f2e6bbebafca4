"""The redistribution planner, as properties over random pipelines, parallelism changes and key distributions.

One edge ``up -> down`` (hash or rebalance) checkpointed at parallelism ``(pa, pb)`` with records in flight on every
channel (some received by ``down`` and not processed: its input channel state; some still queued at ``up``: its
output channel state) and keyed state in ``down``, restored at ``(pa2, pb2)``. The coordinator's plan
(``app.domain.restore``) says which new subtask gets which segment and slice; the runtime's rules
(``spark_plugin.task.restore``) say which records it keeps and where a re-sent record goes. Every restored
record must reach exactly one new subtask, the owner of its key group on a hash edge, and replay in the order it
travelled: a key's in-flight records from one upstream subtask keep their order.
"""

from __future__ import annotations

import pickle
from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.db.models import AckRow, CheckpointRow, JobRow
from app.domain.restore import _plan
from contract.channel_state import frame
from contract.keygroups import key_group, key_group_range, operator_index
from spark_plugin.api.state import KeyedState
from spark_plugin.network.framing import decode_records, encode_records
from spark_plugin.network.recovered import keep_key_groups
from spark_plugin.task.channel_state import ChannelStateReader


def key_of(record: tuple) -> int:
    return record[0]


@st.composite
def scenarios(draw):
    maxp = draw(st.sampled_from([4, 8, 16, 128]))
    par = st.integers(1, min(maxp, 6))
    pa, pb, pa2, pb2 = draw(par), draw(par), draw(par), draw(par)
    partitioning = draw(st.sampled_from(["hash", "rebalance"]))
    keys = draw(st.integers(1, 40))
    # each upstream subtask emits records (key, u, seq); each channel has a processed prefix, then input state,
    # then output state
    channels = {}
    for u in range(pa):
        emitted = draw(st.lists(st.integers(0, keys - 1), max_size=40))
        per_channel: dict[int, list] = defaultdict(list)
        for seq, k in enumerate(emitted):
            b = operator_index(key_group(k, maxp), maxp, pb) if partitioning == "hash" else seq % pb
            per_channel[b].append((k, u, seq))
        for b in range(pb):
            records = per_channel[b]
            cut1 = draw(st.integers(0, len(records)))
            cut2 = draw(st.integers(cut1, len(records)))
            chunk = draw(st.integers(1, 5))
            channels[(u, b)] = (records[:cut1], records[cut1:cut2], records[cut2:], chunk)
    return maxp, pa, pb, pa2, pb2, partitioning, channels


def _segment_blob(parts: list[tuple[dict, list[tuple]]], chunk: int) -> tuple[bytes, list[dict]]:
    """One subtask's channel-state blob: its segments' records framed into buffers of ``chunk`` records."""
    data, segments, offset = [], [], 0
    for meta, records in parts:
        buffers = [encode_records(records[i : i + chunk]) for i in range(0, len(records), chunk)]
        blob = frame(buffers)
        segments.append(
            dict(meta, offset=offset, length=len(blob), buffer_count=len(buffers), record_count=len(records))
        )
        data.append(blob)
        offset += len(blob)
    return b"".join(data), segments


def checkpoint(maxp, pa, pb, partitioning, channels):
    """The acks and blobs of the checkpoint: output state at ``up``, input state and keyed state at ``down``."""
    blobs: dict[str, bytes] = {}
    acks = []
    for u in range(pa):
        parts = [
            ({"channel": f"out:up[{u}]->down[{b}]", "direction": "output", "peer_vertex": "down", "peer_subtask": b,
              "partitioning": partitioning}, channels[(u, b)][2])
            for b in range(pb) if channels[(u, b)][2]
        ]
        data, segments = _segment_blob(parts, 2)
        blobs[f"c-up-{u}"] = data
        acks.append(AckRow(vertex="up", subtask_index=u, operator_blob_id=None, channel_blob_id=f"c-up-{u}",
                           segments=segments, source_offsets=None, key_group_start=None, key_group_end=None))
    for b in range(pb):
        parts = [
            ({"channel": f"in:up[{u}]->down[{b}]", "direction": "input", "peer_vertex": "up", "peer_subtask": u,
              "partitioning": partitioning}, channels[(u, b)][1])
            for u in range(pa) if channels[(u, b)][1]
        ]
        data, segments = _segment_blob(parts, channels[(0, b)][3])
        blobs[f"c-down-{b}"] = data
        lo, hi = key_group_range(b, maxp, pb)
        state = KeyedState(maxp, (lo, hi))
        for u in range(pa):
            for k, _, _ in channels[(u, b)][0]:  # processed records: counted in the keyed state
                if partitioning == "hash":  # (behind a rebalance edge a subtask owns no keys: it holds none)
                    state.put(k, state.get(k, 0) + 1)
        blobs[f"o-down-{b}"] = pickle.dumps(state.snapshot())
        acks.append(AckRow(vertex="down", subtask_index=b, operator_blob_id=f"o-down-{b}",
                           channel_blob_id=f"c-down-{b}", segments=segments, source_offsets=None,
                           key_group_start=lo, key_group_end=hi))
    return acks, blobs


def restore(maxp, pa2, pb2, partitioning, acks, blobs):
    """What each new ``down`` subtask replays, in recovery order (its input state, then the re-sent output state),
    and the keyed state it loads."""
    job = JobRow(id=1, graph={
        "vertices": [
            {"id": "up", "parallelism": pa2, "max_parallelism": maxp, "keyed": False},
            {"id": "down", "parallelism": pb2, "max_parallelism": maxp, "keyed": True},
        ],
        "edges": [{"source": "up", "target": "down", "partitioning": partitioning}],
    })
    blob_rows = {bid: type("Blob", (), {"id": bid, "sha256": "0" * 64, "size": len(b)}) for bid, b in blobs.items()}
    plan = _plan(job, CheckpointRow(id=9, is_savepoint=False), acks, blob_rows, None, [])
    subtasks = {(s.vertex, s.subtask_index): s for s in plan.subtasks}

    def records_of(seg) -> list[list[tuple]]:
        data = blobs[seg.blob_id][seg.offset : seg.offset + seg.length]
        return [decode_records(b) for b in ChannelStateReader(data).buffers()]

    replayed: dict[int, list[tuple]] = {b: [] for b in range(pb2)}
    states: dict[int, KeyedState] = {}
    for b in range(pb2):
        sub = subtasks[("down", b)]
        own = key_group_range(b, maxp, pb2)
        for seg in sub.input_channel_state:
            buffers = [encode_records(r) for r in records_of(seg)]
            if partitioning == "hash":
                buffers, _ = keep_key_groups(buffers, key_of, maxp, own, (seg.key_group_start, seg.key_group_end))
            for buf in buffers:
                replayed[b].extend(decode_records(buf))
        states[b] = KeyedState(maxp, own)
        for ref in sub.operator_state:
            states[b].restore(pickle.loads(blobs[ref.blob_id]))
    resent: dict[int, list[tuple]] = {b: [] for b in range(pb2)}
    turn = 0
    for a in range(pa2):
        for seg in subtasks[("up", a)].output_channel_state:
            for buffer in records_of(seg):
                if partitioning == "hash":  # partitioned again for the new downstream parallelism
                    for r in buffer:
                        resent[operator_index(key_group(key_of(r), maxp), maxp, pb2)].append(r)
                else:  # whole buffers spread over the channels of the edge
                    resent[turn % pb2].extend(buffer)
                    turn += 1
    return {b: replayed[b] + resent[b] for b in range(pb2)}, states, plan


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_restored_record_reaches_exactly_one_subtask_the_owner_of_its_key_group_in_channel_order(scenario):
    maxp, pa, pb, pa2, pb2, partitioning, channels = scenario
    acks, blobs = checkpoint(maxp, pa, pb, partitioning, channels)
    got, states, plan = restore(maxp, pa2, pb2, partitioning, acks, blobs)

    in_flight = Counter(r for parts in channels.values() for r in parts[1] + parts[2])
    delivered = Counter(r for records in got.values() for r in records)
    assert delivered == in_flight, "a restored record was lost or delivered twice"
    for b, records in got.items():
        if partitioning == "hash":
            own = key_group_range(b, maxp, pb2)
            assert all(own[0] <= key_group(key_of(r), maxp) <= own[1] for r in records), (
                f"down[{b}] replays a record of another subtask's key groups"
            )
        # hash: a key's records from one upstream subtask in order; rebalance (no keys): a channel's records
        streams: dict[tuple, list[int]] = defaultdict(list)
        for k, u, seq in records:
            streams[(k, u) if partitioning == "hash" else (u, seq % pb)].append(seq)
        for stream, seqs in streams.items():
            assert seqs == sorted(seqs), f"down[{b}]: {stream} replays out of order: {seqs}"
    if partitioning != "hash":
        return

    # keyed state (behind a hash edge): every key's count lands once, at the owner of its key group
    processed = Counter(k for parts in channels.values() for k, _, _ in parts[0])
    restored: Counter = Counter()
    for b, state in states.items():
        own = key_group_range(b, maxp, pb2)
        for k, n in state.items():
            assert own[0] <= key_group(k, maxp) <= own[1]
            restored[k] += n
    assert restored == processed
    assert bool(plan.rescaled) == (pa2 != pa or pb2 != pb)
