"""The pipelines the failure tests run, their expected output, and a killer of subtask processes.

A keyed counter under backpressure: ``(key, seq)`` from two sequence sources, hashed by key into a slow
counting stage that emits ``(key, seq, n)`` where ``n`` is the key's count so far. Exactly-once restore means:
for every key, ``n`` runs 1..count without gaps or repeats, every expected ``seq`` appears once, and the records
of one source subtask keep their order (``seq`` grows with ``n``).

With ``held=True`` the sources keep their last tenth until the killer made all its kills, so a run cannot end
before them. Every Spark task announces its Python worker's pid in ``pid_dir/<stage>-<partition>.pid`` (the stage id grows
with every attempt), so a test can SIGKILL a subtask's process while it runs.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

from spark_plugin import Pipeline
from spark_plugin.connectors import SequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.failure_injection import Announce, SlowCountPerKey, announce

SMALL_BUFFERS = NetworkConfig(buffer_size=1024)
KEYS = 16
RELEASE = "killer-done"


class HeldSequenceSource(SequenceSource):
    """A ``SequenceSource`` that holds back the last tenth of each split until the file ``release`` exists, so a run
    under a :class:`WorkerKiller` cannot end before every kill landed, however fast the machine is."""

    def __init__(self, count: int, keys: int, release: str) -> None:
        super().__init__(count=count, keys=keys)
        self.release_file = release  # not ``release``: that is the Source's method the runtime calls
        self.pid_dir = str(Path(release).parent)

    def poll(self, max_records: int):
        announce(self.pid_dir)  # also while held, when no record passes the Announce map
        return super().poll(max_records)

    def build_split_reader(self, split, position):
        return HeldSplit(super().build_split_reader(split, position), self.release_file)


class HeldSplit:
    """A split reader that stops at nine tenths of its split until the file ``release`` exists."""

    def __init__(self, reader, release: str) -> None:
        self.reader, self.release = reader, release
        self.released = False

    def _room(self) -> int | None:
        """How many more records may go out now (None: no hold)."""
        if self.reader.limit is None or self.released:
            return None
        if os.path.exists(self.release):
            self.released = True
            return None
        return max(self.reader.limit * 9 // 10 - self.reader.k, 0)

    def poll(self, max_records: int):
        room = self._room()
        if room == 0:
            return []
        return self.reader.poll(max_records if room is None else min(max_records, room))

    def wait_hint(self) -> float | None:
        return 0.05 if self._room() == 0 else self.reader.wait_hint()

    def __getattr__(self, name):
        return getattr(self.reader, name)


def keyed_counter(
    name: str, count: int | None, sink, pid_dir: str | Path, delay: float = 0.0003, held: bool = False,
    regenerated: bool = False,
) -> Pipeline:
    """``held``: the sources keep their last tenth until the ``WorkerKiller`` on ``pid_dir`` is done.
    ``regenerated``: a deterministic map of its own (one subtask, fed by both sources) before the counting, which
    regenerates its outputs from logged inputs (``spark_plugin.task.regeneration``)."""
    p = Pipeline(name, parallelism=2)
    source = (
        HeldSequenceSource(count, KEYS, str(Path(pid_dir) / RELEASE)) if held and count is not None
        else SequenceSource(count=count, keys=KEYS)
    )
    stream = p.source(source, id="src").map(Announce(str(pid_dir)), id="announce")
    if regenerated:  # one subtask: each source's records stay in order through it
        stream = stream.rebalance().map(Announce(str(pid_dir)), id="regen", deterministic=True, parallelism=1)
    (
        stream
        .key_by(lambda r: r[0])
        .process(SlowCountPerKey(str(pid_dir), delay), id="count")
        .sink(sink, id="out")
    )
    return p


def expected_keys(count: int) -> dict[int, list[int]]:
    """The seqs each key receives, in order, from a run of ``count`` records."""
    src = SequenceSource(count=count, keys=KEYS)
    src.open(0, 1)
    out: dict[int, list[int]] = defaultdict(list)
    for seq in range(count):
        out[src.key_of(seq)].append(seq)
    return dict(out)


def check_exactly_once(rows: list[tuple[int, int, int]], count: int, sources: int = 2) -> None:
    """Assert the sink holds exactly the expected ``(key, seq, n)`` rows: counts, no gaps, per-source order."""
    expected = expected_keys(count)
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for key, seq, n in rows:
        by_key[int(key)].append((int(n), int(seq)))
    seen = sum(len(v) for v in by_key.values())
    dup = seen - len({(k, s) for k, v in by_key.items() for _, s in v})
    assert set(by_key) == set(expected), f"keys {sorted(set(expected) ^ set(by_key))} differ"
    missing = sorted({s for v in expected.values() for s in v} - {s for v in by_key.values() for _, s in v})
    assert not missing, f"{len(missing)} records lost (never in the sink), e.g. seqs {missing[:20]}"
    for key, got in by_key.items():
        got.sort()
        ns = [n for n, _ in got]
        assert ns == list(range(1, len(expected[key]) + 1)), (
            f"key {key}: counts {len(ns)} rows, expected {len(expected[key])}; {dup} duplicate (key, seq) rows; "
            f"first gap or repeat near n={next((i + 1 for i, n in enumerate(ns) if n != i + 1), None)}"
        )
        assert sorted(s for _, s in got) == expected[key], f"key {key}: other seqs than expected"
        for r in range(sources):
            from_r = [s for _, s in got if s % sources == r]
            assert from_r == sorted(from_r), f"key {key}: records of source subtask {r} out of order"


class WorkerKiller:
    """SIGKILLs the Python worker of a random running subtask at random moments, ``kills`` times.

    Each kill waits until every task of a newer attempt (a higher stage id) announced itself, then sleeps a
    random ``1..max_wait`` seconds, so the kills land in the middle of processing, restores and checkpoints.
    """

    def __init__(self, pid_dir: Path, tasks: int, kills: int, seed: int, min_wait: float = 1.0,
                 max_wait: float = 3.0) -> None:
        self.pid_dir = Path(pid_dir)
        self.tasks = tasks
        self.kills = kills
        self.rng = random.Random(seed)
        self.min_wait, self.max_wait = min_wait, max_wait
        self.killed: list[tuple[str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="killer", daemon=True)

    def __enter__(self) -> WorkerKiller:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)
        self._release()

    def _release(self) -> None:
        (self.pid_dir / RELEASE).touch()

    def _stages(self) -> dict[str, list[Path]]:
        stages: dict[str, list[Path]] = defaultdict(list)
        for f in self.pid_dir.glob("*.pid"):
            stages[f.name.split("-")[0]].append(f)
        return stages

    def _up(self, files: list[Path]) -> bool:
        """Every task of the attempt announced itself, or some did 3 s ago (a restored attempt with nothing
        left to count: its counting tasks see no record, so only the sources announce)."""
        if len(files) >= self.tasks:
            return True
        try:
            return time.time() - min(f.stat().st_mtime for f in files) > 3.0
        except (FileNotFoundError, ValueError):
            return False

    def _run(self) -> None:
        last_stage = ""
        while len(self.killed) < self.kills and not self.stop.is_set():
            stages = self._stages()
            ready = sorted(s for s, files in stages.items() if s > last_stage and self._up(files))
            if not ready:
                self.stop.wait(0.1)
                continue
            stage = ready[-1]
            if self.stop.wait(self.rng.uniform(self.min_wait, self.max_wait)):
                return
            victim = self.rng.choice(sorted(stages[stage]))
            pid = int(victim.read_text())
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # that attempt already ended; wait for the next
            self.killed.append((victim.name, pid))
            last_stage = stage
        self._release()  # every kill landed: held sources may end the run


class PhasedSequenceSource(SequenceSource):
    """A load that rises and falls: each split emits its first ``burst`` records as fast as its output takes them,
    then ``rate`` records per second; its last tenth waits for the file ``release`` (so the quiet phase lasts until
    the test has seen what it waits for). The phase follows the split's position, so a restored run picks up in the
    phase it was in."""

    def __init__(self, count: int, keys: int, burst: int, rate: float, release: str) -> None:
        super().__init__(count=count, keys=keys)
        self.burst, self.slow_rate, self.release_file = burst, rate, release  # ``release`` is the Source's method

    def build_split_reader(self, split, position):
        return PhasedSplit(super().build_split_reader(split, position), self.burst, self.slow_rate, self.release_file)


class PhasedSplit:
    def __init__(self, reader, burst: int, rate: float, release: str) -> None:
        self.reader, self.burst, self.rate, self.release = reader, burst, rate, release
        self.next_at = 0.0

    def _held(self) -> bool:
        return (self.reader.limit is not None and self.reader.k >= self.reader.limit * 9 // 10
                and not os.path.exists(self.release))

    def poll(self, max_records: int):
        if self.reader.k < self.burst:
            return self.reader.poll(min(max_records, self.burst - self.reader.k))
        now = time.monotonic()
        if now < self.next_at or self._held():
            return []
        self.next_at = max(self.next_at, now) + 1.0 / self.rate
        return self.reader.poll(1)

    def wait_hint(self) -> float | None:
        if self.reader.k < self.burst:
            return self.reader.wait_hint()
        return 0.05 if self._held() else max(self.next_at - time.monotonic(), 0.0)

    def __getattr__(self, name):
        return getattr(self.reader, name)


class CountAgain:
    """Keyed process function of the second keyed stage: counts per key again and emits ``(key, seq, n1, n2)``;
    ``n2 == n1`` for every record exactly when the key's records crossed the second shuffle once each, in order."""

    def __init__(self, pid_dir: str, delay: float = 0.0) -> None:
        self.pid_dir = pid_dir
        self.delay = delay

    def __call__(self, key, record, state):
        announce(self.pid_dir)
        if self.delay:
            time.sleep(self.delay)
        n = (state.value() or 0) + 1
        state.update(n)
        return [(key, record[1], record[2], n)]


def two_keyed_stages(
    name: str, count: int | None, sink, pid_dir: str | Path, parallelism: tuple[int, int, int],
    delay: float = 0.0003, held: bool = False,
) -> Pipeline:
    """``src -> key_by -> count1 -> key_by -> count2 -> sink`` with parallelism ``(src, count1, count2)``; the second
    stage is the slow one, so both shuffles hold in-flight data under backpressure."""
    src, first, second = parallelism
    p = Pipeline(name, parallelism=src)
    source = (
        HeldSequenceSource(count, KEYS, str(Path(pid_dir) / RELEASE)) if held and count is not None
        else SequenceSource(count=count, keys=KEYS)
    )
    (
        p.source(source, id="src")
        .key_by(lambda r: r[0])
        .process(SlowCountPerKey(str(pid_dir), 0.0), id="count1", parallelism=first)
        .key_by(lambda r: r[0])
        .process(CountAgain(str(pid_dir), delay), id="count2", parallelism=second)
        .sink(sink, id="out")
    )
    return p


def check_two_stages_exactly_once(rows: list[tuple[int, int, int, int]], count: int, splits: int) -> None:
    """The sink holds every ``(key, seq)`` once; each stage counted each key's records 1..n without gaps or
    repeats; records of one source split reached the first stage in order, and each key's records crossed the
    second shuffle in the order the first stage emitted them (``n2 == n1``)."""
    expected = expected_keys(count)
    by_key: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for key, seq, n1, n2 in rows:
        by_key[int(key)].append((int(seq), int(n1), int(n2)))
    seqs = [s for v in by_key.values() for s, _, _ in v]
    assert len(seqs) == len(set(seqs)), f"{len(seqs) - len(set(seqs))} records written twice"
    missing = sorted({s for v in expected.values() for s in v} - set(seqs))
    assert not missing, f"{len(missing)} records lost, e.g. seqs {missing[:20]}"
    for key, got in by_key.items():
        assert sorted(s for s, _, _ in got) == expected[key], f"key {key}: other seqs than expected"
        assert sorted(n1 for _, n1, _ in got) == list(range(1, len(got) + 1)), f"key {key}: stage 1 miscounted"
        crossed = [(s, n1, n2) for s, n1, n2 in got if n1 != n2]
        assert not crossed, f"key {key}: reordered or repeated across the second shuffle, e.g. {crossed[:3]}"
        for split in range(splits):
            by_n1 = [s for s, _, _ in sorted((r for r in got if r[0] % splits == split), key=lambda r: r[1])]
            assert by_n1 == sorted(by_n1), f"key {key}: records of source split {split} out of order"
