"""The pipeline API: validation before Spark starts, chaining, and what each operator computes."""

from __future__ import annotations

import re
import threading
from collections import Counter

import pytest

from spark_plugin import Pipeline, PipelineError
from spark_plugin.connectors import CollectSink, DiscardSink, SequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator


def run_threads(p: Pipeline) -> dict[str, list]:
    coord = InMemoryCoordinator()
    results = ThreadedRun(p, coord.reporter, coord.events, NetworkConfig(buffer_size=256)).start().join(60)
    out: dict[str, list] = {}
    for r in results:
        for op_id, o in r.outputs.items():
            if "records" in o:
                out.setdefault(op_id, []).extend(o["records"])
    return out


# ------------------------------------------------------------------------------------------------ validation


def test_unpicklable_function_is_refused_naming_the_operator():
    lock = threading.Lock()
    p = Pipeline("bad")
    p.source(SequenceSource(count=1), id="src").map(lambda r: (lock, r), id="holds-a-lock").sink(DiscardSink())
    with pytest.raises(PipelineError, match="'holds-a-lock'.*cannot be pickled"):
        p.plan()


def test_forward_edge_between_different_parallelisms_is_refused():
    p = Pipeline("bad")
    p.source(SequenceSource(count=1), id="src", parallelism=2).map(str, id="narrow", parallelism=1).sink(
        DiscardSink()
    )
    with pytest.raises(PipelineError, match=r"'narrow' \(parallelism 1\) is forward-connected to 'src'"):
        p.plan()


def test_duplicate_operator_ids_are_refused():
    p = Pipeline("bad")
    p.source(SequenceSource(count=1), id="x").map(str, id="x").sink(DiscardSink())
    with pytest.raises(PipelineError, match="'x' is used twice"):
        p.plan()


def test_an_operator_without_a_sink_downstream_is_refused():
    p = Pipeline("bad")
    p.source(SequenceSource(count=1), id="src").map(str, id="dangling")
    with pytest.raises(PipelineError, match="'dangling' has no downstream operator"):
        p.plan()


def test_parallelism_must_be_positive_and_within_max_parallelism():
    p = Pipeline("bad", max_parallelism=4)
    p.source(SequenceSource(count=1), id="src").rebalance().map(str, id="wide", parallelism=8).sink(DiscardSink())
    with pytest.raises(PipelineError, match="'wide': parallelism 8 exceeds max_parallelism 4"):
        p.plan()
    p = Pipeline("bad")
    p.source(SequenceSource(count=1), id="src", parallelism=0).sink(DiscardSink())
    with pytest.raises(PipelineError, match="'src': parallelism 0"):
        p.plan()


def test_invalid_operator_id_is_refused():
    p = Pipeline("bad")
    p.source(SequenceSource(count=1), id="has space").sink(DiscardSink())
    with pytest.raises(PipelineError, match="'has space'"):
        p.plan()


def test_an_operator_id_that_starts_with_a_dot_is_refused_before_any_state_is_written():
    """Each subtask names its state object after its operator; the blob store takes no name starting with a dot,
    so every ack of such an operator would be refused at run time."""
    p = Pipeline("bad")
    p.source(SequenceSource(count=1), id=".hidden").sink(DiscardSink())
    with pytest.raises(PipelineError, match=r"'\.hidden' must not start with '\.'"):
        p.plan()


def test_a_max_parallelism_beyond_the_coordinators_key_groups_is_a_pipeline_error():
    p = Pipeline("bad", max_parallelism=10**6)
    p.source(SequenceSource(count=1), id="src").sink(DiscardSink())
    with pytest.raises(PipelineError, match="max_parallelism 1000000 is more key groups than the coordinator takes"):
        p.plan()


# ------------------------------------------------------------------------------------------------ chaining


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({"time_limit": float("nan")}, "time_limit must be a number of seconds above 0 (or None: no limit), got nan"),
        ({"time_limit": -1}, "time_limit must be a number of seconds above 0"),
        ({"time_limit": float("inf")}, "time_limit must be a number of seconds above 0"),
        ({"stop_after_checkpoints": 0}, "stop_after_checkpoints must be a number of checkpoints of at least 1"),
    ],
)
def test_a_limit_that_could_never_end_a_run_or_ends_it_before_it_starts_is_refused_before_spark(limits, said):
    p = Pipeline("limits", parallelism=1)
    p.source(SequenceSource(count=None, keys=4), id="src").sink(DiscardSink(), id="out")
    with pytest.raises(ValueError, match=re.escape(said)):
        p.run(None, "http://127.0.0.1:9", **limits)  # no Spark and no coordinator are needed to refuse it


def test_forward_connected_operators_of_equal_parallelism_are_chained():
    p = Pipeline("chains", parallelism=2)
    (
        p.source(SequenceSource(count=1), id="src")
        .map(str, id="a")
        .filter(bool, id="b")
        .key_by(len)
        .reduce(max, id="r")
        .map(str, id="c")
        .rebalance()
        .map(str, id="d", parallelism=1)
        .sink(DiscardSink(), id="out")
    )
    plan = p.plan()
    assert [(v.id, v.name, v.parallelism) for v in plan.vertices] == [
        ("src", "src -> a -> b", 2),
        ("r", "r -> c", 2),
        ("d", "d -> out", 1),
    ]
    graph = plan.graph().model_dump(mode="json")
    assert [(e["source"], e["target"], e["partitioning"]) for e in graph["edges"]] == [
        ("src", "r", "hash"),
        ("r", "d", "rebalance"),
    ]
    assert [v["kind"] for v in graph["vertices"]] == ["source", "operator", "sink"]
    assert [v["keyed"] for v in graph["vertices"]] == [False, True, False]


# ------------------------------------------------------------------------------------------------ operators


def test_keyed_aggregate_counts_every_key_exactly():
    p = Pipeline("agg", parallelism=2)
    (
        p.source(SequenceSource(count=3000, keys=7, skew=1.2), id="src")
        .key_by(lambda r: r[0])
        .aggregate(lambda: 0, lambda acc, r: acc + 1, id="count", parallelism=3)
        .sink(CollectSink(), id="out")
    )
    out = run_threads(p)["out"]
    final: dict[int, int] = {}
    for key, n in out:
        final[key] = max(final.get(key, 0), n)
    src = SequenceSource(count=3000, keys=7, skew=1.2)
    src.open(0, 1)
    assert final == dict(Counter(src.key_of(s) for s in range(3000)))
    assert final[0] > final[6]  # the skew favours the first keys


def test_map_flat_map_filter_and_reduce_compute_their_results():
    p = Pipeline("ops", parallelism=1)
    (
        p.source(SequenceSource(count=100, keys=1), id="src")
        .map(lambda r: r[1], id="seq")
        .filter(lambda s: s % 2 == 0, id="even")
        .flat_map(lambda s: [(s % 3, s), (s % 3, s)], id="twice")
        .key_by(lambda kv: kv[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), id="sum", parallelism=2)
        .sink(CollectSink(), id="out")
    )
    out = run_threads(p)["out"]
    assert len(out) == 100  # 50 even numbers, twice each, one running sum per record
    final: dict[int, int] = {}
    for key, total in out:
        final[key] = max(final.get(key, 0), total)
    expected: dict[int, int] = {}
    for s in range(0, 100, 2):
        expected[s % 3] = expected.get(s % 3, 0) + 2 * s
    assert final == expected


def test_process_function_keeps_value_state_per_key():
    def numbering(key, record, state):
        n = (state.value() or 0) + 1
        state.update(n)
        return [(key, n)]

    p = Pipeline("process", parallelism=2)
    (
        p.source(SequenceSource(count=400, keys=5), id="src")
        .key_by(lambda r: r[0])
        .process(numbering, id="number")
        .sink(CollectSink(), id="out")
    )
    out = run_threads(p)["out"]
    by_key: dict[int, list[int]] = {}
    for key, n in out:
        by_key.setdefault(key, []).append(n)
    assert sum(len(v) for v in by_key.values()) == 400
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in by_key.values())


def test_broadcast_sends_every_record_to_every_subtask():
    p = Pipeline("bcast")
    p.source(SequenceSource(count=50), id="src").broadcast().map(lambda r: r[1], id="m", parallelism=3).sink(
        CollectSink(), id="out"
    )
    assert sorted(run_threads(p)["out"]) == sorted(list(range(50)) * 3)


def test_rebalance_spreads_records_over_all_subtasks():
    p = Pipeline("rebalance")
    p.source(SequenceSource(count=90), id="src").rebalance().map(lambda r: r[1], id="m", parallelism=3).sink(
        CollectSink(), id="out"
    )
    coord = InMemoryCoordinator()
    results = ThreadedRun(p, coord.reporter, coord.events).start().join(60)
    per_subtask = [len(r.outputs["out"]["records"]) for r in results if r.vertex == "m"]
    assert per_subtask == [30, 30, 30]


def _self_pair(record):
    """``((user, user), seq)``: even records build the pair from one string, odd ones from two equal strings."""
    user = f"user-{record[0]}"
    return ((user, user if record[1] % 2 == 0 else f"user-{record[0]}"), record[1])


def _final_counts(parallelism: int, to_keyed) -> tuple[dict, list]:
    """300 sequence records mapped by ``to_keyed`` to ``(key, seq)`` and counted per key: each key's last count,
    and the source's key of each record (to build what the counts must be)."""
    p = Pipeline("keys", parallelism=parallelism)
    (
        p.source(SequenceSource(count=300, keys=3), id="src")
        .map(to_keyed, id="keyed")
        .key_by(lambda r: r[0])
        .aggregate(lambda: 0, lambda n, _r: n + 1, id="count")
        .sink(CollectSink(), id="out")
    )
    final: dict = {}
    for key, n in run_threads(p)["out"]:
        final[key] = max(final.get(key, 0), n)
    src = SequenceSource(count=300, keys=3)
    src.open(0, 1)
    return final, [src.key_of(s) for s in range(300)]


@pytest.mark.parametrize("parallelism", [1, 2])
def test_equal_tuple_keys_are_one_key_however_their_parts_were_built(parallelism):
    final, keys = _final_counts(parallelism, _self_pair)
    assert final == dict(Counter((f"user-{k}",) * 2 for k in keys))


def _conversation(record):
    """``(frozenset of two users, seq)``, the users added in either order."""
    users = [f"user-{record[0]}", f"user-{record[0] + 100}", f"user-{record[0] + 200}"]
    return (frozenset(users if record[1] % 2 else users[::-1]), record[1])


def test_equal_frozenset_keys_are_one_key_whatever_order_their_items_came_in():
    final, keys = _final_counts(2, _conversation)
    assert final == dict(Counter(_conversation((k, s))[0] for s, k in enumerate(keys)))
