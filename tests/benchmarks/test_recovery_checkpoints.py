"""Scenario 10's arithmetic: the first completed checkpoint of an attempt, the end of the replay, the report. No
timings."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks import cli
from benchmarks.recovery_checkpoints import (
    RcReport,
    Restored,
    first_completed,
    markdown,
    replay_end,
    seconds_to_first_checkpoint,
    speedup,
)

SUBMITTED = 1_000.0  # epoch seconds


def _cp(id, attempt, trigger_s, e2e_ms=None, status="COMPLETED", persisted=0, savepoint=False):
    return SimpleNamespace(
        id=id, attempt=attempt, status=SimpleNamespace(value=status), trigger_timestamp=int(trigger_s * 1000),
        end_to_end_duration=e2e_ms, persisted_data=persisted, is_savepoint=savepoint,
    )


def test_the_first_checkpoint_is_the_attempts_first_to_complete_not_the_first_triggered():
    cps = [
        _cp(3, 1, 990.0, 200),  # the restored attempt's predecessor
        _cp(4, 2, 1_002.0, 3_000),  # triggered first, completed at 1005.0
        _cp(5, 2, 1_003.0, 500),  # completed at 1003.5: the first
        _cp(6, 2, 1_001.0, None, status="ABORTED"),
        _cp(7, 2, 1_000.5, 100, savepoint=True),
    ]
    assert first_completed(cps, 2).id == 5
    assert seconds_to_first_checkpoint(cps, 2, SUBMITTED) == 3.5


def test_an_attempt_without_a_completed_checkpoint_has_no_time():
    assert seconds_to_first_checkpoint([_cp(4, 2, 1_002.0, None, status="ABORTED")], 2, SUBMITTED) is None


def test_the_replay_ends_with_the_last_record_its_source_had_emitted_by_the_checkpoint():
    emitted = {0: 10, 1: 5}  # split 0 had emitted seqs 0, 2, .., 18; split 1 seqs 1, 3, .., 9
    outputs = [
        (1, 18, 1, 1_004.0),  # in flight (split 0, 9th record)
        (2, 9, 1, 1_006.0),  # in flight (split 1, 5th record): the last
        (1, 20, 2, 1_007.0),  # new (split 0, 11th record)
        (2, 11, 2, 1_008.0),  # new
    ]
    assert replay_end(outputs, emitted, SUBMITTED) == (2, 6.0)
    assert replay_end([(1, 20, 1, 1_002.0)], emitted, SUBMITTED) == (0, None)


def test_the_report_compares_both_settings():
    runs = [
        Restored(False, 2 * 1024 * 1024, 40_000, first_checkpoint_s=12.0, replay_s=11.0),
        Restored(True, 2 * 1024 * 1024, 40_000, first_checkpoint_s=3.0, replay_s=11.5,
                 first_checkpoint_persisted=1024 * 1024),
    ]
    assert speedup(runs) == 4.0
    text = markdown(RcReport({"delay": 0.0005, "buffers": (4, 16, 20), "interval": 500}, runs), "overtake bench recovery-checkpoints")
    assert "| off | 2,048 KiB | 40,000 | 12.00 s | 11.00 s | 0 KiB |" in text
    assert "| on | 2,048 KiB | 40,000 | 3.00 s | 11.50 s | 1,024 KiB |" in text
    assert "4.0× sooner" in text
    assert speedup(runs[:1]) is None


def test_scenario_10_is_recovery_checkpoints():
    assert cli.bench_args(["10"]).chosen == ["recovery-checkpoints"]
    assert cli.bench_args(["recovery-checkpoints"]).command() == "overtake bench recovery-checkpoints"
