"""Scenario 9's arithmetic: the wall-clock phases, and one policy's figures from its checkpoints. No timings."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks import cli
from benchmarks.adaptive import WaveSettings, markdown, phase_at, summarize

W = WaveSettings(period_s=10.0, busy_share=0.5)


def _cp(id, status, trigger_s, e2e=None, persisted=0, kind="aligned", reason=None, chosen=None):
    decision = None
    if chosen:
        decision = SimpleNamespace(chosen=SimpleNamespace(value=chosen), reason=f"checkpoint {id - 1} took {id} ms")
    return SimpleNamespace(
        id=id, status=SimpleNamespace(value=status), trigger_timestamp=int(trigger_s * 1000),
        end_to_end_duration=e2e, persisted_data=persisted, checkpoint_type=SimpleNamespace(value=kind),
        failure_reason=reason, is_savepoint=False, decision=decision,
    )


def test_each_period_starts_calm_and_ends_busy():
    assert [phase_at(t, 10.0, 0.5) for t in (100.0, 104.9, 105.0, 109.9, 110.0)] == [
        "calm", "calm", "busy", "busy", "calm"]
    assert phase_at(107.0, 10.0, 0.2) == "calm" and phase_at(108.5, 10.0, 0.2) == "busy"


def test_a_policy_run_splits_durations_by_phase_and_leaves_warm_up_and_the_end_of_the_run_out():
    cps = [
        _cp(1, "COMPLETED", 100.0, e2e=9000),  # warm-up
        _cp(2, "COMPLETED", 101.0, e2e=20, chosen="aligned_then_unaligned"),
        _cp(3, "COMPLETED", 106.0, e2e=300, persisted=4096, kind="unaligned", chosen="unaligned"),
        _cp(4, "COMPLETED", 107.0, e2e=100, persisted=2048, kind="unaligned", chosen="unaligned"),
        _cp(5, "ABORTED", 108.0, reason="expired: 1 of 6 acked", chosen="unaligned"),
        _cp(6, "ABORTED", 109.0, reason="job_ended: FINISHED", chosen="unaligned"),
    ]
    r = summarize("adaptive", cps, W)
    assert (r.completed, r.failed, r.unfinished) == (3, 1, 1)
    assert (r.p50_calm_ms, r.p50_busy_ms) == (20.0, 300.0)
    assert r.persisted_total == 6144 and r.persisted_per_checkpoint == 2048
    assert (r.persisted_busy, r.persisted_calm) == (3072, 0)
    assert r.unaligned_share == 2 / 3
    assert r.choices == {"calm: aligned_then_unaligned": 1, "busy: unaligned": 4}
    assert r.p50_by_choice == {"calm: aligned_then_unaligned": 20.0, "busy: unaligned": 300.0}
    assert r.reasons and all("N" in x for x in r.reasons)
    text = markdown([r], W, "overtake bench adaptive", "cores: 2")
    assert "| adaptive | 3 | 1 | 300 ms | 20 ms |" in text and "busy: unaligned × 4 (300 ms)" in text
    assert "| 3 KiB / 0 KiB |" in text


def test_scenario_9_is_known_by_name_and_number():
    assert cli.bench_args(["9"]).chosen == ["adaptive"]
    assert cli.bench_args(["adaptive"]).chosen == ["adaptive"]


def test_the_policies_named_unbounded_run_again_without_the_credit_bound(monkeypatch):
    import client.sync
    from benchmarks.adaptive import measure

    calls = []

    class Runner:
        url = "http://coordinator"

        def run(self, scenario, label, factory, last, policy, depth, seconds, network=None, **kw):
            calls.append((label, policy, network))
            return SimpleNamespace(job_id=len(calls), records=10, throughput=1.0)

    class Client:
        def __init__(self, url):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def list_checkpoints(self, job_id, limit):
            return SimpleNamespace(items=[_cp(1, "COMPLETED", 100.0, e2e=9000), _cp(2, "COMPLETED", 106.0, e2e=30)])

    monkeypatch.setattr(client.sync, "OvertakeClient", Client)
    w = WaveSettings(policies=("aligned", "unaligned"), unbounded=("unaligned", "adaptive"))
    runs = measure(Runner(), w)
    assert [r.policy for r in runs] == ["aligned", "unaligned", "unaligned, no credit bound"]
    assert [c[2] for c in calls[:2]] == [None, None]
    label, policy, network = calls[2]
    assert policy == "unaligned" and network.output_backlog_buffers is None  # adaptive was not run: not unbounded
    assert runs[2].p50_busy_ms == 30.0
