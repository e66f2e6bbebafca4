"""One case of the rescale soak: what it draws from its seed (``Case``, ``draw``) and the pipeline it builds at a
parallelism (``build``): a counted source, a keyed stage and one or two branches ending in tagging sinks."""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass
from typing import Any

from spark_plugin.connectors import SequenceSource
from spark_plugin.connectors.base import Sink

BRANCHES = ("chained", "forward", "hash", "rebalance", "broadcast")
KEYED = "count"


def _key(record: tuple) -> Any:
    return record[0]


def _count(delay: float, key: Any, record: tuple, state: Any) -> list[tuple]:
    if delay:
        time.sleep(delay)
    n = (state.value() or 0) + 1
    state.update(n)
    return [(record[0], record[1], n)]


def _count_again(delay: float, key: Any, record: tuple, state: Any) -> list[tuple]:
    if delay:
        time.sleep(delay)
    n = (state.value() or 0) + 1
    state.update(n)
    return [(*record, n)]


def _pass(delay: float, record: tuple) -> tuple:
    if delay:
        time.sleep(delay)
    return record


class TagSink(Sink):
    """Keeps ``(subtask index, record)`` for every record it writes; its state is the list so far (after a rescale,
    several old subtasks' lists)."""

    def __init__(self) -> None:
        self.records: list[tuple[int, Any]] = []

    def write(self, record: Any) -> None:
        self.records.append((self.subtask_index, record))

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"records": list(self.records)}

    def restore(self, state: Any) -> None:
        self.records.extend((int(t), tuple(r)) for t, r in state["records"])

    def close(self) -> Any:
        return {"records": self.records}


def sink_id(branch: str) -> str:
    return f"out-{branch}"


def branch_vertex(branch: str) -> str:
    """The vertex whose parallelism the branch has (its head after chaining)."""
    return {"chained": KEYED, "forward": sink_id("forward"), "hash": "count2", "rebalance": "reb", "broadcast": "bc"}[
        branch
    ]


@dataclass
class Case:
    """Everything a case draws from its seed."""

    seed: int
    count: int
    keys: int
    skew: float
    max_parallelism: int
    branches: list[str]
    slow: str
    """The vertex that sleeps per record (``count`` or a branch's)."""
    delay: float
    network: dict[str, Any]
    parallelisms: list[dict[str, int]]
    """One entry per run: run 0, then each restore."""
    checkpoints: int
    concurrent: bool
    checkpoint_after: list[int]
    """Records the keyed stage took in before each checkpoint of run 0."""
    kill_after: list[float]
    """Per restored run but the last: seconds after its start when it is stopped (a kill during replay); negative:
    stopped once a checkpoint of it completed."""
    during_recovery: bool
    """``checkpoints_during_recovery`` for restored runs that are not rescaled."""
    restore_older: bool
    """Restore the older of two completed checkpoints of run 0 rather than the newer."""

    def vertices(self) -> list[str]:
        """The vertices whose parallelism is drawn (a forward sink, or a chained one beside another branch, which
        then becomes a vertex of its own behind a forward edge, has the keyed stage's)."""
        return ["src", KEYED] + [branch_vertex(b) for b in self.branches if b not in ("chained", "forward")]

    def describe(self) -> str:
        runs = " -> ".join(
            "(" + ", ".join(f"{v}={p[v]}" for v in self.vertices()) + ")" for p in self.parallelisms
        )
        return (
            f"seed {self.seed}: {self.count} records, {self.keys} keys, maxp {self.max_parallelism}, branches "
            f"{'+'.join(self.branches)}, slow {self.slow}, {self.checkpoints} checkpoint(s)"
            f"{' 2 concurrent' if self.concurrent else ''}, runs {runs}"
            f"{', kills during replay' if self.kill_after else ''}"
        )


def draw(seed: int) -> Case:
    rng = random.Random(seed)
    maxp = rng.choice([4, 8, 16, 128])
    top = min(4, maxp)
    branches = rng.sample(BRANCHES, rng.choice([1, 1, 2]))
    if "chained" in branches and "forward" in branches:
        branches.remove("forward")  # a forward sink beside a chained one is the same forward edge twice
    if branches == ["forward"]:
        branches = ["chained"]  # alone, a forward sink chains to the keyed stage: no forward edge
    branches.sort(key=BRANCHES.index)

    used = ["src", KEYED] + [branch_vertex(b) for b in branches if b not in ("chained", "forward")]

    def parallelism(before: dict[str, int] | None) -> dict[str, int]:
        while True:
            p = {v: rng.randint(1, top) for v in ("src", KEYED, "count2", "reb", "bc")}
            p[sink_id("forward")] = p[KEYED]  # a forward edge joins equal parallelism
            if before is None or any(p[v] != before[v] for v in used):
                return p

    restores = 1 + (rng.random() < 0.35)
    runs = [parallelism(None)]
    for _ in range(restores):
        runs.append(parallelism(runs[-1]))
    checkpoints = rng.choice([1, 1, 2, 3])
    concurrent = checkpoints >= 2 and rng.random() < 0.5
    count = rng.choice([1000, 2000, 3000])
    after = sorted(rng.randint(20, count // 4) for _ in range(checkpoints))
    return Case(
        seed=seed,
        count=count,
        keys=rng.choice([1, 3, 16, 64]),
        skew=rng.choice([0.0, 0.0, 1.2]),
        max_parallelism=maxp,
        branches=branches,
        slow=rng.choice([KEYED] + [branch_vertex(b) for b in branches if b not in ("chained", "forward")]),
        delay=rng.choice([0.0003, 0.0006, 0.001]),
        network={
            "buffer_size": rng.choice([128, 256, 512, 1024]),
            "exclusive_buffers_per_channel": rng.randint(1, 2),
            "floating_buffers_per_gate": rng.randint(0, 4),
            "max_buffers_per_output_channel": rng.randint(1, 4),
            "flush_interval": rng.choice([0.005, 0.02]),
        },
        parallelisms=runs,
        checkpoints=checkpoints,
        concurrent=concurrent,
        checkpoint_after=after,
        kill_after=[rng.choice([0.0, 0.01, 0.05, 0.2, -1.0, -1.0]) for _ in range(restores - 1)],
        during_recovery=rng.random() < 0.5,
        restore_older=rng.random() < 0.3,
    )


def build(case: Case, par: dict[str, int]):
    from spark_plugin import Pipeline

    slow = functools.partial
    p = Pipeline("soak", parallelism=par["src"], max_parallelism=case.max_parallelism)

    def delay(vertex: str) -> float:
        return case.delay if case.slow == vertex else 0.0

    counted = (
        p.source(SequenceSource(count=case.count, keys=case.keys, skew=case.skew), id="src", parallelism=par["src"])
        .key_by(_key)
        .process(slow(_count, delay(KEYED)), id=KEYED, parallelism=par[KEYED])
    )
    for b in case.branches:
        if b in ("chained", "forward"):
            counted.sink(TagSink(), id=sink_id(b))
        elif b == "hash":
            counted.key_by(_key).process(slow(_count_again, delay("count2")), id="count2",
                                         parallelism=par["count2"]).sink(TagSink(), id=sink_id(b))
        elif b == "rebalance":
            counted.rebalance().map(slow(_pass, delay("reb")), id="reb", parallelism=par["reb"]).sink(
                TagSink(), id=sink_id(b))
        else:
            counted.broadcast().map(slow(_pass, delay("bc")), id="bc", parallelism=par["bc"]).sink(
                TagSink(), id=sink_id(b))
    return p
