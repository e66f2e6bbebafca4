"""Sources resume where a checkpoint left them, also at another parallelism: every input record exactly once, and
in order within its split (a sequence split, a file, a stream)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from spark_plugin.connectors import JsonLinesSource, SequenceSource
from spark_plugin.connectors.base import Source


def drain(source: Source, limit: int | None = None) -> list:
    out: list = []
    while limit is None or len(out) < limit:
        batch = source.poll(min(7, limit - len(out)) if limit is not None else 7)
        if batch is None:
            break
        out.extend(batch)
    return out


def run_until(make, parallelism: int, reads: list[int], positions=None) -> tuple[list, list[dict]]:
    """Open ``parallelism`` subtasks (restored from ``positions`` if given), read ``reads[i]`` records from subtask
    i, then take a checkpoint of every subtask's offsets."""
    out, offsets = [], []
    for i in range(parallelism):
        s = make()
        s.open(i, parallelism)
        if positions is not None:
            s.restore_positions(positions)
        out += drain(s, reads[i])
        offsets.append(s.offsets())
    return out, offsets


@pytest.mark.parametrize("scales", [(2, 3, 1), (3, 2, 5), (1, 4, 2)])
def test_a_sequence_rescaled_twice_emits_every_seq_once_and_each_split_in_order(scales):
    count = 500

    def make():
        return SequenceSource(count=count, keys=9)

    first, second, third = scales
    a, pos = run_until(make, first, [60 + 13 * i for i in range(first)])
    b, pos = run_until(make, second, [45 + 7 * i for i in range(second)], pos)
    c, _ = run_until(make, third, [None] * third, pos)
    seqs = [r[1] for r in a + b + c]
    assert sorted(seqs) == list(range(count)), "a seq was lost or emitted twice"
    by_split: dict[int, list[int]] = defaultdict(list)
    for seq in seqs:
        by_split[seq % first].append(seq)
    assert all(s == sorted(s) for s in by_split.values()), "a split's seqs out of order"


def test_offsets_of_the_first_version_of_the_sequence_source_still_restore():
    s = SequenceSource(count=20)
    s.open(1, 2)
    s.seek({"emitted": 3})  # seq 1, 3, 5 emitted
    assert [r[1] for r in drain(s)] == list(range(7, 20, 2))
    t = SequenceSource(count=20)
    t.open(0, 1)
    t.restore_positions([{"emitted": 2}, {"emitted": 3}])  # old subtask 0 emitted 0, 2; old 1 emitted 1, 3, 5
    assert sorted(r[1] for r in drain(t)) == [4, *range(6, 20)]


def test_json_line_files_rescaled_are_read_exactly_once_each_file_in_order(tmp_path):
    for f in range(5):
        (tmp_path / f"part-{f}.jsonl").write_text("".join(json.dumps([f, i]) + "\n" for i in range(30)))

    def make():
        return JsonLinesSource(str(tmp_path))

    a, pos = run_until(make, 2, [40, 7])
    b, pos = run_until(make, 3, [11, 0, 52], pos)
    c, _ = run_until(make, 1, [None], pos)
    rows = [tuple(r) for r in a + b + c]
    assert sorted(rows) == [(f, i) for f in range(5) for i in range(30)]
    for f in range(5):
        assert [i for g, i in rows if g == f] == list(range(30)), f"file {f} read out of order"


def test_a_source_that_cannot_split_its_positions_is_refused_with_the_reason():
    class Opaque(Source):
        def poll(self, max_records):
            return None

        def offsets(self):
            return {}

    s = Opaque()
    s.open(0, 3)
    with pytest.raises(NotImplementedError, match="cannot resume at another parallelism than the checkpoint's \\(2\\)"):
        s.restore_positions([{}, {}])
