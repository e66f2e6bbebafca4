"""Scenario 15 (Kafka end to end): its wiring into ``overtake bench``, its report from made-up runs, and one tiny run
against the real broker, local Spark and the coordinator whose counts must add up. No timing is asserted."""

from __future__ import annotations

import json

import pytest

from benchmarks import cli, kafka, options
from benchmarks.kafka import Settings, Variant


def _variant(policy: str, mode: str, latencies: list[float], delivered: int) -> Variant:
    return Variant(policy, mode, seconds=10.0, produced=delivered, delivered=delivered, end_to_end_ms=latencies,
                   pipeline_ms=[x / 2 for x in latencies], delivered_in_window=delivered, checkpoints_ms=[20, 30, 40])


def test_kafka_is_scenario_15_of_overtake_bench_and_seconds_set_the_producing_time():
    assert cli.bench_args(["15"]).chosen == ["kafka"]
    s = options.kafka_settings_from(cli.bench_args(["kafka"], quick=True, seconds=5))
    assert (s.seconds, s.quick, s.interval_ms) == (5, True, 1000)


def test_the_default_rate_is_above_what_the_slow_stage_takes_and_the_waves_below_it_on_average():
    s = Settings()
    capacity = 1000 / s.cost_ms * s.parallelism
    assert s.rate > capacity
    busy, calm = s.wave_rates
    assert busy > capacity > (busy + calm) / 2


def test_the_waves_produce_their_busy_rate_then_their_calm_rate():
    p = kafka.Producer("unused:9092", "t", 0, 10.0, 1, waves=(600, 100, 4.0))
    assert p.due(1.0) == 601 and p.due(2.0) == 1201  # busy half
    assert p.due(3.0) == 1301 and p.due(4.0) == 1401  # calm half
    assert p.due(6.0) == 1401 + 1200  # busy again


def test_the_report_has_a_row_per_variant_and_the_exactly_once_over_at_least_once_ratios(tmp_path):
    runs = [_variant("unaligned", "exactly_once", [float(x) for x in range(1, 101)], 1000),
            _variant("aligned", "exactly_once", [5000.0] * 10, 500),
            _variant("unaligned", "at_least_once", [float(x) for x in range(1, 101)], 2000)]
    text = kafka.write(runs, Settings(), tmp_path, "overtake bench kafka")
    assert "| unaligned, exactly-once | 1,000 | 1,000 | 0 | 51 ms | 99 ms |" in text
    assert "| aligned, exactly-once | 500 | 500 | 0 | 5,000 ms |" in text
    data = json.loads((tmp_path / "kafka.json").read_text())
    assert [(r["policy"], r["mode"]) for r in data["runs"]] == [
        ("unaligned", "exactly_once"), ("aligned", "exactly_once"), ("unaligned", "at_least_once")]
    assert data["eos_over_alos"]["records_per_s"] == 0.5
    assert data["eos_over_alos"]["pipeline_p99"] == 1.0


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_a_tiny_run_delivers_every_produced_record_once_in_each_variant(spark, kafka_broker, tmp_path):
    # below what the stage takes: everything arrives; one variant of each load
    s = Settings(seconds=3.0, rate=50, drain_s=3.0, keys=10, wave_rates=(80, 20), wave_period_s=2.0,
                 variants=(("unaligned", "exactly_once", None, "overload"), ("aligned", "exactly_once", None, "waves"),
                           ("unaligned", "at_least_once", 0.1, "overload")))
    # ``spark``: the run takes the tests' shared session (a session of its own would be the narrow one every later
    # Spark test of the pytest session got)
    runs = kafka.standalone(s, tmp_path, "test", "test", bootstrap=kafka_broker.bootstrap)
    assert [(v.policy, v.mode, v.debloat_s, v.load) for v in runs] == list(s.variants)
    for v in runs:
        assert v.produced > 0
        assert (v.delivered, v.duplicates) == (v.produced, 0), v.label
        assert len(v.end_to_end_ms) == len(v.pipeline_ms) == v.delivered
        assert v.checkpoints_ms, f"{v.label}: no checkpoint completed while producing"
    data = json.loads((tmp_path / "kafka.json").read_text())
    assert [r["delivered"] for r in data["runs"]] == [v.produced for v in runs]


def test_the_floor_queues_records_at_the_stages_bare_cost_and_makes_them_visible_at_the_next_trigger():
    # one subtask, 2 ms a record: three records at once leave at 2, 4 and 6; checkpoints triggered at 0, 5 and 10
    assert kafka.floor_end_to_end([0.0, 0.0, 0.0], 2.0, 1, [0.0, 5.0, 10.0]) == [5.0, 5.0, 10.0]
    # two subtasks take two at once; a record that no trigger follows is left out, as the run never saw it either
    assert kafka.floor_end_to_end([0.0, 0.0, 20.0], 2.0, 2, [3.0, 10.0]) == [3.0, 3.0]
    # an idle stage: the wait is the checkpoint's alone
    assert kafka.floor_end_to_end([100.0], 2.0, 1, [0.0, 1000.0]) == [900.0]


def test_the_breakdown_splits_the_slowest_records_time_and_finds_the_stages_gap_between_calls():
    v = Variant("unaligned", "exactly_once")
    # 100 records, read at once at t=0, through one stage: each call 2 ms, 0.5 ms apart (the runtime's gap), then
    # visible 10 ms after the call; the last records waited longest at the stage
    for i in range(100):
        began = 1.0 + i * 2.5
        v.calls.append((began, began + 2.0, 0.0, -1.0))
        v.parts_ms.append((1.0, began, 2.0, 10.0))  # read 1 ms after produce (t=-1)
    v.produced_ms = [-1.0] * 100
    v.triggers_ms = [float(t) for t in range(0, 1000, 100)]
    x = v.breakdown()
    assert x["p99_parts"] == [1.0, 1.0 + 98.5 * 2.5, 2.0, 10.0]  # the two slowest (at or above the p99), averaged
    assert x["stage_call_ms"] == 2.0 and x["stage_gap_ms"] == 0.5 and x["stage_rate"] == 400.0
    # the floor at the measured call: 100 calls of 2 ms from t=-1 end at 199, visible at the trigger at 200
    assert x["floor_at_call_p99"] == 201.0
    text = kafka.markdown([v], Settings())
    assert x["stage_starved_ms"] == 0  # every record was read before the stage was free
    assert "| unaligned, exactly-once | 1 ms | 247 ms | 2 ms | 10 ms | 2.00 ms | 0.50 ms | 400/s | 0.0 s (0 times) | 201 ms |" in text


def test_the_stage_is_starved_when_the_next_record_waits_in_the_topic_while_it_is_idle():
    v = Variant("unaligned", "exactly_once")
    # produced at 0, but the source reads the second only at 10: the stage (free at 3) idles 8 ms for it
    v.calls = [(1.0, 3.0, 0.5, 0.0), (11.0, 13.0, 10.0, 0.0), (30.0, 32.0, 29.0, 25.0)]
    v.parts_ms = [(0.5, 0.5, 2.0, 5.0), (10.0, 1.0, 2.0, 5.0), (4.0, 1.0, 2.0, 5.0)]
    x = v.breakdown()
    assert x["stage_starved_ms"] == 8.0 and x["stage_starved_times"] == 1  # the third was produced after 13
