"""The rescale soak's check: every record's effect exactly once and per-key order in every sink's output (the rules
are in ``benchmarks.soak``'s docstring)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.soak_case import Case, sink_id
from spark_plugin.connectors import SequenceSource


@dataclass
class Verdict:
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.problems)

    def add(self, other: Verdict) -> None:
        self.records += other.records
        self.lost += other.lost
        self.duplicated += other.duplicated
        self.reordered += other.reordered
        self.problems += other.problems


def results_by_sink(results: Iterable[Any]) -> dict[str, list[tuple[int, tuple]]]:
    out: dict[str, list[tuple[int, tuple]]] = defaultdict(list)
    for res in results:
        for op_id, value in res.outputs.items():
            if isinstance(value, dict) and op_id.startswith("out-"):
                out[op_id].extend((int(t), tuple(r)) for t, r in value["records"])
    return dict(out)


def keys_of(case: Case) -> list[Any]:
    """The key of every seq, as the source draws it."""
    src = SequenceSource(count=case.count, keys=case.keys, skew=case.skew)
    src.open(0, 1)
    return [src.key_of(s) for s in range(case.count)]


def check(case: Case, outputs: dict[str, list[tuple[int, tuple]]]) -> Verdict:
    """Every sink's output against what the source emitted (see the module's docstring)."""
    keys = keys_of(case)
    splits = case.parallelisms[0]["src"]
    v = Verdict()
    for b in case.branches:
        got = outputs.get(sink_id(b), [])
        v.records += len(got)
        if b == "broadcast":
            v.add(_check_broadcast(case, keys, got))
        else:
            v.add(_check_once(b, keys, splits, [r for _, r in got]))
    return v


def _check_once(branch: str, keys: list[Any], splits: int, records: list[tuple]) -> Verdict:
    """Each seq once; per key the counts ``n`` are ``1..N`` and follow each split's seq order."""
    v = Verdict()
    seqs = Counter(r[1] for r in records)
    lost_seqs = sum(1 for s in range(len(keys)) if s not in seqs)
    dup_seqs = sum(n - 1 for n in seqs.values() if n > 1)
    unknown = [s for s in seqs if not 0 <= s < len(keys)]
    if unknown:
        v.problems.append(f"{branch}: records the source never emitted: {unknown[:5]}")
    by_key: dict[Any, list[tuple]] = defaultdict(list)
    for r in records:
        if 0 <= r[1] < len(keys) and r[0] != keys[r[1]] and len(v.problems) < 5:
            v.problems.append(f"{branch}: seq {r[1]} arrived with key {r[0]!r}, not {keys[r[1]]!r}")
        by_key[r[0]].append(r)
    expected = Counter(keys)
    lost_counts = dup_counts = 0
    for key, rs in by_key.items():
        # the keyed state counted each of the key's records once: n runs 1..N (a count missing is an effect lost,
        # one twice or beyond N an effect duplicated)
        ns = Counter(r[2] for r in rs)
        lost_counts += sum(1 for n in range(1, expected[key] + 1) if n not in ns)
        dup_counts += sum(c - 1 for c in ns.values() if c > 1) + sum(1 for n in ns if not 1 <= n <= expected[key])
        # in the order the keyed stage counted them, each split's records of the key in seq order
        last: dict[int, int] = {}
        for r in sorted(rs, key=lambda r: (r[2], r[1])):
            split = r[1] % splits
            if r[1] < last.get(split, -1):
                v.reordered += 1
                if len(v.problems) < 5:
                    v.problems.append(f"{branch}: key {key!r}: seq {r[1]} counted as {r[2]}, after seq {last[split]}")
            last[split] = max(last.get(split, -1), r[1])
        if branch == "hash":
            wrong = [r for r in rs if r[3] != r[2]]
            v.reordered += len(wrong)
            if wrong and len(v.problems) < 5:
                v.problems.append(f"hash: key {key!r}: {len(wrong)} records counted in another order by the second "
                                  f"keyed stage, e.g. {wrong[0]}")
    v.lost = max(lost_seqs, lost_counts)
    v.duplicated = max(dup_seqs, dup_counts)
    if v.lost or v.duplicated:
        missing = [s for s in range(len(keys)) if s not in seqs]
        v.problems.append(f"{branch}: {lost_seqs} records and {lost_counts} counts missing, {dup_seqs} records and "
                          f"{dup_counts} counts more than once; missing seqs {missing[:12]}"
                          f"{'...' if len(missing) > 12 else ''}, twice {[s for s, n in seqs.items() if n > 1][:12]}")
    return v


def _check_broadcast(case: Case, keys: list[Any], got: list[tuple[int, tuple]]) -> Verdict:
    v = Verdict()
    runs = [p["bc"] for p in case.parallelisms]
    by_key_count = Counter(keys)
    per_tag: dict[int, list[tuple]] = defaultdict(list)
    for tag, r in got:
        per_tag[tag].append(r)
    for tag in range(max(runs)):
        rs = per_tag.get(tag, [])
        seqs = Counter(r[1] for r in rs)
        v.duplicated += sum(n - 1 for n in seqs.values() if n > 1)
        alive = [tag < p for p in runs]
        first = alive[0] and alive == sorted(alive, reverse=True)  # from the first run on, then gone
        last = alive[-1] and alive == sorted(alive)  # from some run on up to the last
        by_key: dict[Any, set[int]] = defaultdict(set)
        for r in rs:
            by_key[r[0]].add(r[2])
        for key, total in by_key_count.items():
            ns = sorted(by_key.get(key, set()))
            if all(alive):
                missing = total - len(ns)
            elif first and ns and ns != list(range(1, len(ns) + 1)):
                missing = ns[-1] - len(ns)  # a prefix has no gap
            elif last and ns and ns != list(range(total - len(ns) + 1, total + 1)):
                missing = total - ns[0] + 1 - len(ns)  # a suffix has no gap
            else:
                missing = 0
            if missing:
                v.lost += missing
                if len(v.problems) < 5:
                    v.problems.append(f"broadcast: receiver {tag} lacks {missing} of key {key!r}'s {total} records")
    return v
