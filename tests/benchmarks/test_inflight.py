"""Scenario 8 (in flight: fixed buffers against buffer debloating): its arithmetic, its report, and its wiring into
``overtake bench`` with the runs replaced by made-up ones. No timing is asserted."""

from __future__ import annotations

import json
from types import SimpleNamespace

from benchmarks import cli, inflight, options
from benchmarks.disk import inflight_capacity_bytes
from benchmarks.flip76 import RunStats, Settings
from benchmarks.report import markdown
from benchmarks.results import BenchResults
from spark_plugin.network.config import BACKLOG, NetworkConfig


def _run(sizing: str, depth: int, persisted: list[int], recovery: float) -> inflight.InflightRun:
    stats = RunStats("inflight", sizing, "unaligned", depth, 10, completed=len(persisted), durations_ms=[20, 30],
                     persisted_bytes=persisted)
    return inflight.InflightRun(sizing, depth, stats, restored_checkpoint=9, restored_bytes=persisted[-1],
                                replayed_records=100, recovery_s=recovery, replay_s=recovery / 4)


def _result() -> inflight.InflightResult:
    s = inflight.Settings.quick_settings()
    r = inflight.InflightResult(settings={**s.__dict__})
    r.runs = [_run("fixed", 1, [200 << 10, 210 << 10, 220 << 10], 2.0),
              _run("debloated 1 s", 1, [100 << 10, 100 << 10], 1.5),
              _run("debloated 0.1 s", 1, [20 << 10, 30 << 10], 1.0)]
    return r


def test_the_three_sizings_are_flinks_defaults_and_debloating_to_one_second_and_a_tenth():
    sizes = inflight.sizings()
    assert list(sizes) == ["fixed", "debloated 1 s", "debloated 0.1 s"]
    assert sizes["fixed"] == NetworkConfig() and sizes["fixed"].debloat_target_s is None
    assert [n.debloat_target_s for n in sizes.values()][1:] == [1.0, 0.1]
    assert all(n.buffer_size == 32 * 1024 for n in sizes.values())


def test_persisted_bytes_per_checkpoint_and_ratios_against_the_fixed_sizing():
    r = _result()
    fixed, tenth = r.run("fixed", 1), r.run("debloated 0.1 s", 1)
    assert fixed.persisted_p50 == 210 << 10 and fixed.persisted_avg == 210 << 10
    assert tenth.persisted_p50 == 25 << 10
    text = inflight.markdown(r, "overtake bench inflight --quick", "cores: 2")
    assert "## 8. In flight: fixed buffers against buffer debloating" in text
    row = next(line for line in text.splitlines() if "| debloated 0.1 s |" in line)
    assert "25.0 KiB" in row and "0.12×" in row and "1.00 s" in row and "0.50×" in row and "0.25 s" in row
    assert inflight.summary(r).startswith("depth 1 fixed: 210.0 KiB per checkpoint, recovery 2.0 s")


def test_the_scenario_writes_its_own_report_and_a_section_of_the_main_one(tmp_path):
    r = _result()
    inflight.write(r, tmp_path, "overtake bench inflight", "cores: 2")
    assert "| 1 | fixed |" in (tmp_path / "inflight.md").read_text()
    data = json.loads((tmp_path / "inflight.json").read_text())
    assert [x["sizing"] for x in data["runs"]] == list(inflight.sizings())
    results = BenchResults(settings=Settings.quick_settings(), inflight=r)
    assert "## 8. In flight" in markdown(results)


def test_the_in_flight_capacity_follows_the_credit_and_backlog_bound():
    net = NetworkConfig()
    per_output = min(net.max_buffers_per_output_channel,
                     net.exclusive_buffers_per_channel + net.floating_buffers_per_gate + BACKLOG)
    assert net.output_buffers_bound() == per_output == 10
    assert net.inflight_capacity_bytes(2, 2) == (2 * 2 + 8 + 2 * (per_output + 1)) * net.buffer_size
    assert inflight_capacity_bytes(net) == net.inflight_capacity_bytes(2, 2)  # the disk scenario's blob
    small = NetworkConfig(exclusive_buffers_per_channel=1, floating_buffers_per_gate=0)
    assert small.output_buffers_bound() == 1 + BACKLOG
    assert small.inflight_capacity_bytes(0, 1) == (1 + BACKLOG + 1) * small.buffer_size


def test_scenario_8_by_name_or_number_with_quick_settings():
    args = cli.bench_args(["8"], quick=True)
    assert args.chosen == ["inflight"]
    s = options.inflight_settings_from(args)
    assert s.quick and s.depths == (1, 2) and s.checkpoints < inflight.Settings().checkpoints
    assert s.spark_tasks() == 6
    assert options.inflight_settings_from(cli.bench_args(["inflight"], depths="1")).depths == (1,)


def test_the_quick_scenario_runs_every_sizing_at_every_depth_into_the_report(tmp_path, monkeypatch):
    import app.local
    import benchmarks.acks

    class FakeCoordinator:
        url = "http://fake"
        proc = SimpleNamespace(pid=None)

        def __init__(self, *a, **k):
            pass

        def start(self):
            return self

        def stop(self):
            pass

    calls = []

    def measure_one(spark, url, s, depth, sizing, network, status):
        calls.append((depth, sizing, network.debloat_target_s, s.checkpoints))
        return _run(sizing, depth, [10 << 10], 1.0)

    monkeypatch.setattr(cli, "_start_spark", lambda tasks: SimpleNamespace(stop=lambda: None, tasks=tasks))
    monkeypatch.setattr(cli, "machine_facts", lambda spark, pg: {"cores": "2"})
    monkeypatch.setattr(app.local, "LocalCoordinator", FakeCoordinator)
    monkeypatch.setattr(benchmarks.acks, "new_pg_database", lambda url: ("postgresql://fake", lambda: None))
    monkeypatch.setattr(inflight, "measure_one", measure_one)
    assert cli.main(cli.bench_args(["inflight"], quick=True, out=tmp_path)) == 0
    quick = inflight.Settings.quick_settings().checkpoints
    assert calls == [(d, name, net.debloat_target_s, quick) for d in (1, 2)
                     for name, net in inflight.sizings().items()]
    assert "| 2 | debloated 0.1 s |" in (tmp_path / "inflight.md").read_text()
    assert "## 8. In flight" in (tmp_path / "report.md").read_text()
