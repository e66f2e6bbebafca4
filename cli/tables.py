"""The command line's building blocks for showing things: units (sizes, durations, times), status colours, and
tables fitted to the terminal's width. Server-supplied strings are never parsed as rich markup."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from contract import units

DASH = "-"

STATUS_STYLES = {
    "COMPLETED": "green",
    "FINISHED": "green",
    "RUNNING": "cyan",
    "PENDING": "yellow",
    "CREATED": "yellow",
    "FAILING": "bold red",
    "ABORTED": "red",
    "FAILED": "red",
    "CANCELLED": "magenta",
}


# ------------------------------------------------------------------------------------------- units


def human_bytes(n: int | float | None) -> str:
    """``1536`` → ``1.5 KiB``; bytes below 1 KiB as they are."""
    return units.human_bytes(n, DASH)


def duration(ms: int | float | None) -> str:
    """Milliseconds for people: ``850 ms``, ``2.35 s``, ``3m 05s``, ``1h 02m``."""
    if ms is None:
        return DASH
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def timestamp(ms: int | None) -> str:
    """Milliseconds since the epoch as local time, to the second."""
    if ms is None:
        return DASH
    return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def status(value: Any) -> Text:
    name = getattr(value, "value", value)
    return Text(str(name), style=STATUS_STYLES.get(str(name), ""))


def _text(value: Any) -> Text:
    if isinstance(value, Text):
        return value
    return Text(DASH if value is None else str(value))


@dataclass(frozen=True)
class Col:
    """A column of a :class:`FitTable`: ``keep`` ranks how long it stays when the width runs out (higher stays
    longer); a ``free`` column holds free text that may be cut short with an ellipsis."""

    name: str
    keep: int = 5
    right: bool = False
    free: bool = False


FREE_MIN = 16
"""The narrowest a free-text column gets before columns are left out."""


class FitTable:
    """A table that fits the width it is drawn in (the terminal's, or ``COLUMNS``): cells never wrap; free-text
    columns are cut short with an ellipsis first, then the least important columns are left out, and the title says
    which (``--json`` has everything)."""

    def __init__(self, title: str | None, columns: list[Col], rows: Iterable[Iterable[Any]]) -> None:
        self.title = title
        self.columns = columns
        self.rows = [[_text(v) for v in row] for row in rows]

    def _widths(self, index: int) -> tuple[int, int]:
        """(natural, narrowest) width of a column, padding included."""
        col = self.columns[index]
        natural = max([len(col.name), *(row[index].cell_len for row in self.rows)])
        narrowest = min(natural, max(len(col.name), FREE_MIN)) if col.free else natural
        return natural + 3, narrowest + 3

    def layout(self, width: int) -> tuple[list[int], list[str]]:
        """The indices of the columns that fit in ``width``, and the names of those left out."""
        shown = list(range(len(self.columns)))
        left_out: list[str] = []
        while len(shown) > 1 and sum(self._widths(i)[1] for i in shown) + 1 > width:
            victim = min(shown, key=lambda i: (self.columns[i].keep, -i))
            shown.remove(victim)
            left_out.append(self.columns[victim].name)
        return shown, left_out

    def table(self, width: int) -> Table:
        shown, left_out = self.layout(width)
        title = self.title
        if left_out:
            note = f"(left out for the width: {', '.join(left_out)}; widen the terminal or use --json)"
            title = f"{title} {note}" if title else note
        table = Table(title=title, title_justify="left", header_style="bold")
        fixed = sum(self._widths(i)[0] for i in shown if not self.columns[i].free)
        free = [i for i in shown if self.columns[i].free]
        room = (width - 1 - fixed) // max(1, len(free)) - 3  # what is left for each free-text column
        for i in shown:
            col = self.columns[i]
            natural = self._widths(i)[0] - 3
            table.add_column(
                col.name,
                justify="right" if col.right else "left",
                no_wrap=True,
                overflow="ellipsis",
                min_width=min(natural, FREE_MIN) if col.free else natural,
                max_width=max(min(natural, FREE_MIN), room) if col.free else None,
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in shown))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)


def _table(
    title: str | None,
    columns: Iterable[str],
    rows: Iterable[Iterable[Any]],
    right: set[str] = frozenset(),
    keep: dict[str, int] | None = None,
    free: set[str] = frozenset(),
) -> FitTable:
    keep = keep or {}
    cols = [Col(c, keep.get(c, 5), c in right, c in free) for c in columns]
    return FitTable(title, cols, rows)


def _fields(pairs: Iterable[tuple[str, Any]]) -> Table:
    """A two-column grid of labels and values."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in pairs:
        grid.add_row(Text(label), _text(value))
    return grid


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


NOT_FINISHED_WHY = "the job ended or restarted, or a newer one completed: not failures"


def checkpoint_counts(completed: int, failed: int, not_finished: int, in_progress: int) -> str:
    """A job's checkpoints by state, in the words of the UI and the API: completed, failed (expired or declined),
    not finished (NOT FINISHED in a list), in progress."""
    return (
        f"{completed} completed, {failed} failed, {not_finished} not finished ({NOT_FINISHED_WHY}), "
        f"{in_progress} in progress"
    )
