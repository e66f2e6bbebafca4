"""What an ``overtake bench`` scenario is (``Scenario``: how it runs, its settings, its share of the progress bar and
of the Spark slots) and what it runs with (``Bench``: the options, Spark, the coordinator, the report, the progress)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.flip76 import Runner, Settings
from benchmarks.options import SCENARIOS, BenchArgs
from benchmarks.results import BenchResults


@dataclass
class Bench:
    """One ``overtake bench`` run as its scenarios see it. ``status(msg, scenario)`` shows what runs now; ``done(msg)``
    advances the progress bar, prints ``msg`` and rewrites the main report, so an interrupted run keeps what it
    measured. ``spark``, ``coordinator`` and ``runner`` are there while a scenario that needs them runs; ``drop``
    drops the coordinator's database."""

    args: BenchArgs
    s: Settings
    results: BenchResults
    out: Path
    data_dir: Path
    status: Callable[..., None]
    done: Callable[[str], None]
    spark: Any = None
    coordinator: Any = None
    runner: Runner | None = None
    drop: Callable[[], None] | None = None

    @property
    def url(self) -> str:
        return self.coordinator.url

    def machine(self) -> str:
        """The machine facts in one line, for a scenario's own report."""
        return ", ".join(f"{k}: {v}" for k, v in self.results.machine.items())

    def begin(self, name: str) -> None:
        """Shows scenario ``name`` on the progress bar."""
        self.status("", SCENARIOS[name])

    def streamed(self, name: str, module_name: str, settings: Any) -> None:
        """A scenario whose module reports each run as it ends (``measure(runner, settings, each, into=runs)``): every
        run is shown and its report rewritten at once."""
        module = importlib.import_module(f"benchmarks.{module_name}")
        self.begin(name)
        machine = self.machine()
        runs: list[Any] = []

        def each(x: Any) -> None:
            self.done(f"{x.label}: {module.headline(x)}")
            module.write(runs, settings, self.out, self.results.command, machine)

        module.measure(self.runner, settings, each, into=runs)


def _no_settings(args: BenchArgs) -> Any:
    return None


def _one_step(settings: Any, s: Settings, chosen: list[str]) -> int:
    return 1


def _no_tasks(settings: Any, s: Settings) -> int:
    return 0


@dataclass(frozen=True)
class Scenario:
    """A scenario of ``overtake bench``: ``run(bench, settings)`` with ``settings(args)``; ``steps`` is how many times
    it calls ``done``, ``tasks`` the Spark slots it needs (beyond the FLIP-76 runs'). ``spark``: it needs the shared
    Spark session and coordinator; ``alone``: it runs after the shared coordinator stopped."""

    name: str
    run: Callable[[Bench, Any], None]
    settings: Callable[[BenchArgs], Any] = _no_settings
    steps: Callable[[Any, Settings, list[str]], int] = _one_step
    tasks: Callable[[Any, Settings], int] = _no_tasks
    spark: bool = False
    alone: bool = False
