"""A randomized rescale soak: thousands of unaligned checkpoints and rescales of random pipelines, each checked for
exact output and per-key order (issue 33, item 4; ``overtake bench soak --cases N``).

One **case** (all of it drawn from its seed with ``random.Random(seed)``):

- a pipeline: a ``SequenceSource`` (``(key, seq)`` records over interleaved splits) -> hash -> a keyed stage that
  counts per key (``count``, emits ``(key, seq, n)``) -> one or two branches, each ending in a sink that tags every
  record with the index of the sink subtask that wrote it: ``chained`` (the sink chained to the keyed stage; beside
  another branch the keyed stage fans out and it is a sink vertex behind a forward edge), ``forward`` (a sink vertex
  behind a forward edge), ``hash`` (a second keyed counter, ``(key, seq, n, n2)``), ``rebalance`` and ``broadcast``
  (a pass-through map);
- parallelisms (1-4, within ``max_parallelism`` of 4, 8, 16 or 128), small network buffers, a slow stage (the keyed
  one or a branch) so that every edge is backpressured;
- run 0 under the threads harness (``spark_plugin.testing.threads``: every subtask a thread, real sockets, no
  Spark): one to three unaligned checkpoints at random moments, sometimes two in flight at once
  (``max_concurrent=2``); stopped after a completed checkpoint (as a failure would);
- a restore at a newly drawn parallelism of every vertex (up or down; a forward branch follows the keyed stage),
  with the plan the coordinator makes: ``app.domain.restore._plan`` (the coordinator's own planner, called on the
  acks as the coordinator stores them, ``app.domain.ack_recording.ack_row``; no database); ``checkpoints_during_recovery`` as
  the driver sets it (off for a rescaled attempt, sometimes on otherwise);
- in about a third of the cases a second rescale: the restored run is stopped either 0-200 ms after it started
  (often while its gates still replay restored in-flight data: a **kill during replay**), after checkpoints
  triggered right away, which a replaying subtask declines (the checkpoint restored next, if one completed; else the
  same checkpoint again), or once its first checkpoint completed (triggered once every subtask reported running,
  as the coordinator does); it is restored at yet another parallelism. Checkpoint ids never repeat across runs;
- the last run goes to the end; then ``check`` looks at every sink's output.

**The check** (``check``): every record's effect exactly once and per-key order.

- every non-broadcast branch holds each ``seq`` of the source exactly once (``lost``: missing, ``duplicated``: more);
- the keyed stage's count: for every key the counts ``n`` are exactly ``1..N`` (a count missing or twice is a lost or
  a duplicated effect on the keyed state) and, in the order of ``n``, each source split's records of the key come in
  ``seq`` order (``reordered``); the second keyed stage must count the same: ``n2 == n`` for every record (a key's
  records reordered across the second shuffle show as ``n2 != n``);
- broadcast: per receiver index, no record twice; a receiver index that exists in every run got every record, one
  that exists from the first run on got a prefix of each key's records, one that exists up to the last run a suffix.

What one case does not reproduce: the interleaving of the threads (a seed fixes what is drawn, not the timing), so a
failing seed is replayed with ``--repeat`` until it fails again.

Here: running a case and the command. The case and its pipeline are in ``benchmarks.soak_case``, the in-memory
coordinator and the restore plan in ``benchmarks.soak_coordinator``, the check in ``benchmarks.soak_check``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.soak_case import KEYED, Case, build, draw
from benchmarks.soak_check import Verdict, check, results_by_sink
from benchmarks.soak_coordinator import MemoryCoordinator, coordinator_plan
from contract.events import JobStatusChanged
from spark_plugin.network.config import NetworkConfig

# ====================================================================================== running a case


class CaseFailed(AssertionError):
    """A case whose output is wrong or whose run failed or hung."""


class Inconclusive(Exception):
    """A case that checked nothing (its first run ended before a checkpoint completed): counted, not failed."""


@dataclass
class CaseResult:
    case: Case
    verdict: Verdict
    rescales: int
    checkpoints_completed: int
    kills_in_replay: int
    rerouted: int
    restored_bytes: int
    seconds: float
    error: str | None = None
    skipped: bool = False
    chained: int = 0
    """Restores from a checkpoint that a restored (rescaled) run completed."""
    evidence: dict | None = None
    """Of a failed check: each restore's checkpoint (acks, blobs, plan parts) and the last run's output."""


def _wait(cond: Callable[[], bool], what: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise CaseFailed(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.002)


def run_case(case: Case, timeout: float = 120.0, unguarded: bool = False) -> CaseResult:
    """Run ``case`` and check its output; a run that fails or hangs is a failed case (``error``). ``unguarded``:
    checkpoints during recovery also in rescaled runs, which the driver does not allow (an exploration of what the
    runtime's own guard, per subtask that rerouted records, is worth alone)."""
    from spark_plugin.testing.threads import ThreadedRun

    t0 = time.monotonic()
    network = NetworkConfig(**case.network)
    stats = {"checkpoints": 0, "kills": 0, "rerouted": 0, "bytes": 0, "chained": 0}
    evidence: list[dict] = []
    run = None
    try:
        coord = MemoryCoordinator(expected_subtasks=0)
        run = ThreadedRun(build(case, case.parallelisms[0]), coord.reporter, coord.events, network)
        coord.expected_subtasks = len(run.specs)  # a checkpoint completes once every subtask of the run acked it
        run.start()
        keyed = [run.subtask(KEYED, i) for i in range(case.parallelisms[0][KEYED])]
        for i, after in enumerate(case.checkpoint_after):
            _wait(lambda after=after: sum(s.records_in for s in keyed) >= after, "records to flow", timeout)
            cid = i + 1
            if case.concurrent:
                coord.trigger(cid, "unaligned", max_concurrent=2)
                if i + 1 < case.checkpoints:
                    continue  # the next one follows right behind
            else:
                coord.trigger(cid, "unaligned")
            _wait(lambda cid=cid: coord.settled(cid) or run.finished(), f"checkpoint {cid}", timeout)
        last = case.checkpoints
        _wait(lambda: all(coord.settled(c) for c in range(1, last + 1)) or run.finished(), "checkpoints",
              timeout)
        completed = sorted(c for c in coord.completed if c <= last)
        if not completed and run.finished() and not coord.declines:
            raise Inconclusive("the run ended before a checkpoint completed")
        if not completed:
            raise CaseFailed(f"no checkpoint of run 0 completed (declines: {coord.declines[:3]})")
        stats["checkpoints"] += len(completed)
        coord.publish(JobStatusChanged(status="CANCELLED"))
        run.join(timeout)
        run = None
        restore_from = completed[0] if case.restore_older and len(completed) > 1 else completed[-1]
        next_id = case.checkpoints + 1
        source = coord
        rng = random.Random(case.seed * 7919 + 1)
        for r, par in enumerate(case.parallelisms[1:], start=1):
            pipeline = build(case, par)
            if len(source.acks[restore_from]) != source.expected_subtasks:
                raise CaseFailed(f"checkpoint {restore_from} completed with {len(source.acks[restore_from])} of "
                                 f"{source.expected_subtasks} acks")
            plan, parts = coordinator_plan(pipeline.plan(), source.acks[restore_from], source.blobs, restore_from)
            blobs = source.blobs
            evidence.append({"run": r, "checkpoint": restore_from, "acks": source.acks[restore_from],
                             "blobs": {b: blobs[b] for b in _blob_ids(source.acks[restore_from])}, "parts": parts})

            def fetch(blob_id, start, end, blobs=blobs):
                data = blobs[blob_id]
                return data if start is None else data[start : end + 1]

            last_run = r == len(case.parallelisms) - 1
            # as the driver: off for a rescaled attempt (unless exploring without that guard)
            during = case.during_recovery and (unguarded or not plan.rescaled)
            net = NetworkConfig(**case.network, checkpoints_during_recovery=during)
            coord = MemoryCoordinator(expected_subtasks=0)
            run = ThreadedRun(pipeline, coord.reporter, coord.events, net, restore=parts, fetch=fetch,
                              restore_checkpoint=restore_from)
            coord.expected_subtasks = len(run.specs)
            run.start()
            stats["rerouted"] += sum(s.restore_stats.rerouted_records for s in run.subtasks if s.restore_stats)
            stats["bytes"] += sum(s.restore_stats.restored_bytes for s in run.subtasks if s.restore_stats)
            if last_run:
                results = run.join(timeout)
                run = None
                outputs = results_by_sink(results)
                verdict = check(case, outputs)
                return CaseResult(case, verdict, len(case.parallelisms) - 1,
                                  stats["checkpoints"], stats["kills"], stats["rerouted"], stats["bytes"],
                                  time.monotonic() - t0, chained=stats["chained"],
                                  evidence=None if verdict.ok else {"restores": evidence, "outputs": outputs})
            # a kill during replay: checkpoints triggered at once (declined while the gates replay, unless
            # checkpoints during recovery), the run stopped after a few milliseconds; or (kill_after < 0) stopped
            # once its first checkpoint completed (for a rescaled run: right after its replay), triggered again and
            # again until one does
            kill_after = case.kill_after[r - 1]
            # checkpoint ids go on from the restored one's, never reused (as the coordinator's per-job counter)
            cid = first = next_id
            if kill_after < 0:  # as the coordinator: no trigger before every subtask reported running
                _wait(lambda coord=coord, run=run: len(coord.running) == coord.expected_subtasks or run.finished(),
                      "the restored run's subtasks to run", timeout)
            coord.trigger(cid, "unaligned")
            if kill_after >= 0:
                time.sleep(kill_after)
                if any(s.gate.recovering for s in run.subtasks):
                    stats["kills"] += 1
                if cid not in coord.completed and rng.random() < 0.5:
                    cid += 1
                    coord.trigger(cid, "unaligned")
                    _wait(lambda coord=coord, run=run, f=first: all(coord.settled(c) for c in (f, f + 1))
                          or run.finished(), "checkpoints of the restored run", timeout)
            else:
                while not coord.completed and not run.finished():
                    _wait(lambda coord=coord, run=run, cid=cid: coord.settled(cid) or run.finished(),
                          f"checkpoint {cid} of the restored run", timeout)
                    if cid in coord.aborted:
                        time.sleep(0.005)
                        cid += 1
                        coord.trigger(cid, "unaligned")
            next_id = cid + 1
            coord.publish(JobStatusChanged(status="CANCELLED"))
            run.join(timeout)
            run = None
            done = sorted(coord.completed)
            if done:
                stats["checkpoints"] += len(done)
                stats["chained"] += 1
                restore_from, source = done[-1], coord
            # else: the same checkpoint again, from the same coordinator's blobs
        raise AssertionError("unreachable: the last run returns")
    except Inconclusive:
        if run is not None:
            run.join(timeout)
        return CaseResult(case, Verdict(), 0, 0, 0, 0, 0, time.monotonic() - t0, skipped=True)
    except Exception as e:  # noqa: BLE001 - a failed run is a failed case, reported with its seed
        if run is not None:
            try:
                run.join(5)
            except BaseException:  # noqa: BLE001 - already failing
                pass
        return CaseResult(case, Verdict(problems=[f"{type(e).__name__}: {e}"]), 0, stats["checkpoints"],
                          stats["kills"], stats["rerouted"], stats["bytes"], time.monotonic() - t0,
                          error="".join(traceback.format_exception(e))[-3000:])


def _blob_ids(acks: dict) -> list[str]:
    return [ref["blob_id"] for a in acks.values() for k in ("operator_state", "channel_state") if (ref := a.get(k))]



# ====================================================================================== the command


@dataclass
class Totals:
    cases: int = 0
    skipped: int = 0
    rescales: int = 0
    checkpoints: int = 0
    kills_in_replay: int = 0
    chained: int = 0
    rerouted: int = 0
    restored_bytes: int = 0
    verdict: Verdict = field(default_factory=Verdict)
    failures: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, r: CaseResult) -> None:
        self.cases += 1
        self.skipped += r.skipped
        self.rescales += r.rescales
        self.checkpoints += r.checkpoints_completed
        self.kills_in_replay += r.kills_in_replay
        self.chained += r.chained
        self.rerouted += r.rerouted
        self.restored_bytes += r.restored_bytes
        self.verdict.records += r.verdict.records
        self.verdict.lost += r.verdict.lost
        self.verdict.duplicated += r.verdict.duplicated
        self.verdict.reordered += r.verdict.reordered
        if not r.verdict.ok:
            self.failures.append(r)

    def summary(self) -> str:
        v = self.verdict
        seeds = " ".join(str(f.case.seed) for f in self.failures) or "none"
        return (
            f"cases {self.cases} ({self.skipped} ended before a checkpoint), rescales {self.rescales}, checkpoints completed {self.checkpoints}, kills during "
            f"replay {self.kills_in_replay}, rescales from a rescaled run's checkpoint {self.chained}, records checked {v.records}, in-flight records rerouted {self.rerouted}, "
            f"restored {self.restored_bytes} bytes; lost {v.lost}, duplicated {v.duplicated}, reordered "
            f"{v.reordered}; failed cases {len(self.failures)} (seeds: {seeds}); {self.seconds:.0f} s"
        )


def replay_command(seed: int) -> str:
    return f"python -m benchmarks.soak --seed {seed} --cases 1 --repeat 20"


def soak(cases: int, seed: int = 0, repeat: int = 1, log: Callable[[str], None] = print,
         stop_at_first: bool = False, seconds: float | None = None, unguarded: bool = False,
         keep: str | None = None) -> Totals:
    """Run ``cases`` cases with seeds ``seed, seed+1, ...`` (each ``repeat`` times); ``seconds``: stop earlier."""
    totals = Totals()
    t0 = time.monotonic()
    for n in range(cases):
        case = draw(seed + n)
        for _ in range(repeat):
            r = run_case(case, unguarded=unguarded)
            totals.add(r)
            if not r.verdict.ok:
                log(f"FAILED {case.describe()}")
                for p in r.verdict.problems[:5]:
                    log(f"  {p}")
                if r.error:
                    log("  " + r.error.strip().replace("\n", "\n  "))
                log(f"  replay: {replay_command(case.seed)}")
                if keep and r.evidence is not None:
                    import os
                    import pickle

                    os.makedirs(keep, exist_ok=True)
                    path = os.path.join(keep, f"soak-{case.seed}-{int(time.time())}.pickle")
                    with open(path, "wb") as f:
                        pickle.dump({"case": case, "verdict": r.verdict, "evidence": r.evidence}, f)
                    log(f"  kept: {path}")
                if stop_at_first:
                    totals.seconds = time.monotonic() - t0
                    return totals
        if (n + 1) % 25 == 0:
            totals.seconds = time.monotonic() - t0
            log(f"[{n + 1}/{cases}] {totals.summary()}")
        if seconds is not None and time.monotonic() - t0 > seconds:
            break
    totals.seconds = time.monotonic() - t0
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first case (case n has seed + n)")
    parser.add_argument("--repeat", type=int, default=1, help="run every case this many times")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--stop-at-first", action="store_true")
    parser.add_argument("--describe", action="store_true", help="print each case before it runs")
    parser.add_argument("--keep", default=None, help="folder to pickle a failed case's checkpoints and output into")
    parser.add_argument("--unguarded", action="store_true",
                        help="checkpoints during recovery also in rescaled runs (the driver does not allow it)")
    a = parser.parse_args(argv)
    if a.describe:
        for n in range(a.cases):
            print(draw(a.seed + n).describe())
    totals = soak(a.cases, a.seed, a.repeat, stop_at_first=a.stop_at_first, seconds=a.seconds,
                  unguarded=a.unguarded, keep=a.keep)
    print(totals.summary())
    return 0 if not totals.failures else 1


if __name__ == "__main__":
    sys.exit(main())
