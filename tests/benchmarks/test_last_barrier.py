"""Scenario 14 (last-barrier checkpoints): its arithmetic, the split of a manifest by side, its report and its wiring
into ``overtake bench``, with made-up runs. No timing is asserted."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

from benchmarks import cli, last_barrier, options
from benchmarks.flip76 import RunStats
from benchmarks.last_barrier import PolicyRun, Sides, fan_out, sides_of, summarize

KIB = 1024


def _seg(length: int) -> NS:
    return NS(length=length)


def _subtask(vertex: str, inputs: list[int], outputs: list[int]) -> NS:
    return NS(vertex=vertex, input_channel_state=[_seg(n) for n in inputs],
              output_channel_state=[_seg(n) for n in outputs])


def test_a_manifest_splits_into_input_and_output_side_and_counts_the_flat_maps_outputs_in_both():
    plan = NS(subtasks=[
        _subtask("source", [], [10 * KIB]),
        _subtask("flat", [20 * KIB, 5 * KIB], [8 * KIB]),
        _subtask("slow", [30 * KIB], []),
    ])
    s = sides_of(plan)
    assert (s.input, s.output) == (55 * KIB, 18 * KIB)
    assert s.flat_outputs == 38 * KIB  # the flat_map's output queue and its consumers' input queues


def test_the_summary_takes_percentiles_means_and_the_share_of_flat_map_outputs():
    sides = [Sides(input=30, output=10, flat_outputs=20), Sides(input=50, output=10, flat_outputs=0)]
    x = summarize([100, 200, 300, 400, 1000], [40, 60], sides)
    assert (x["duration_p50"], x["duration_p90"]) == (300.0, 1000.0)
    assert (x["persisted_avg"], x["input_avg"], x["output_avg"], x["flat_outputs_avg"]) == (50, 40, 10, 10)
    assert x["flat_outputs_share"] == 0.2
    assert x["manifests"] == 2


def test_with_nothing_persisted_there_is_no_share():
    x = summarize([5], [0], [Sides()])
    assert x["flat_outputs_share"] is None and x["input_avg"] == 0
    assert summarize([], [], [])["duration_p50"] is None


def test_the_flat_map_emits_fanout_records_per_input_numbered_from_zero():
    assert fan_out(3)((7, 42, "payload")) == [(7, 42, 0), (7, 42, 1), (7, 42, 2)]


def test_the_report_has_one_row_per_policy_and_its_json_the_summary(tmp_path):
    s = last_barrier.Settings.quick_settings()
    runs = [
        PolicyRun(p, RunStats("last-barrier", p, p, 1, 10, completed=1, durations_ms=[100], persisted_bytes=[n]),
                  [Sides(input=n, output=0, flat_outputs=0)])
        for p, n in (("unaligned", 64 * KIB), ("unaligned_last_barrier", 16 * KIB))
    ]
    text = last_barrier.write(runs, s, tmp_path, "overtake bench last-barrier --quick")
    assert "| unaligned | 1 |" in text and "| unaligned_last_barrier | 1 |" in text and "16.0 KiB" in text
    data = json.loads((tmp_path / "last-barrier.json").read_text())
    assert [r["policy"] for r in data["runs"]] == ["unaligned", "unaligned_last_barrier"]


def test_last_barrier_is_scenario_14_of_overtake_bench_and_runs_first_barrier_last_barrier_regenerated_and_aligned():
    assert cli.bench_args(["14"]).chosen == ["last-barrier"]
    s = options.last_barrier_settings_from(cli.bench_args(["last-barrier"], quick=True, seconds=5))
    assert (s.seconds, s.quick) == (5, True)
    assert s.policies == ("unaligned", "unaligned_last_barrier", last_barrier.REGENERATED, "aligned")
    assert s.fanout == 100


def test_only_the_regenerated_variant_declares_the_flat_map_deterministic():
    s = last_barrier.Settings.quick_settings()
    edge = lambda regenerated: last_barrier.flat_map_pipeline("p", s, regenerated).plan().vertex("flat").outputs[0]  # noqa: E731
    assert edge(True).regenerated and not edge(False).regenerated
