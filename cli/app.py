"""The ``overtake`` command line's frame: the typer apps, the global options, the session every command gets, and how
errors reach a person at a terminal. The commands are in ``cli.main``.

Tables for people by default, fitted to the terminal's width (``COLUMNS`` too); ``--json`` (before or after the
command) prints the API's JSON (JSON Lines for ``events``). An error answered by the coordinator is printed in red
and exits 1, and so is a coordinator that cannot be reached (said within a second or two); a missing optional part
(demo, bench) exits 2.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import httpx
import typer
from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.text import Text

from client.errors import CoordinatorUnreachable, OutcomeUnknown, OvertakeError
from client.sync import OvertakeClient

CLI_RETRIES = 2
"""A person waits for the answer: a coordinator that is down is reported after two quick retries (about a second)."""
CLI_TIMEOUT = 10.0
"""Seconds one request may take before the command line gives up on that try."""
CLI_MAX_BACKOFF = 1.0
"""The longest wait between two tries, also when a busy coordinator's Retry-After asks for more: a person at a
terminal is told it is busy in seconds, not after the minutes it may ask for."""

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="overtake",
    help="Unaligned checkpoints for PySpark streaming pipelines: the coordinator and its command line.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
jobs_app = typer.Typer(help="Registered jobs.", no_args_is_help=True)
checkpoints_app = typer.Typer(help="A job's checkpoints.", no_args_is_help=True)
db_app = typer.Typer(help="The coordinator's database.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
app.add_typer(checkpoints_app, name="checkpoints")
app.add_typer(db_app, name="db")


@dataclass
class Session:
    """What the global options decided, handed to every command through the click context."""

    url: str | None
    token: str | None
    json: bool
    out: Console
    err: Console

    def client(self) -> OvertakeClient:
        try:
            return OvertakeClient(
                self.url, token=self.token, timeout=CLI_TIMEOUT, retries=CLI_RETRIES, backoff=0.2,
                max_backoff=CLI_MAX_BACKOFF,
            )
        except ValueError as exc:  # a URL or token the client cannot use: said before any request
            raise _fail(str(exc)) from None

    def show_call(self, call: Callable[[OvertakeClient], BaseModel], render: Callable[[Any], RenderableType]) -> None:
        """Make one SDK call and show its answer."""
        with self.client() as c:
            value = call(c)
        self.show(value, render)

    def show(self, value: BaseModel, render: Callable[[Any], RenderableType]) -> None:
        """The model as JSON with --json, else as ``render`` draws it."""
        if self.json:
            typer.echo(value.model_dump_json(indent=2))
        else:
            self.out.print(render(value))


PIPED_WIDTH = 400
"""Columns of a table printed to no terminal (a pipe, a file, a CI log), unless COLUMNS says otherwise: whole rows,
not rows cut to rich's default of 80 columns."""


def _consoles() -> tuple[Console, Console]:
    # markup off: server text such as 'src[0]' must print as it is
    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return (
        Console(markup=False, highlight=False, width=PIPED_WIDTH if piped else None),
        Console(stderr=True, markup=False, highlight=False),
    )


@app.callback()
def _global_options(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="OVERTAKE_URL", help="Coordinator URL (default http://127.0.0.1:8321)."),
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="OVERTAKE_TOKEN", help="Bearer token (admin or task).")
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the API's JSON instead of tables.")
    ] = False,
) -> None:
    out, err = _consoles()
    ctx.obj = Session(url=url, token=token, json=json_output, out=out, err=err)


def _session(ctx: typer.Context, json_output: bool = False) -> Session:
    """The global options; ``json_output``: the command's own ``--json`` flag."""
    session = ctx.find_object(Session)
    if session is None:  # a command invoked without the group (tests, embedding)
        out, err = _consoles()
        session = Session(None, None, False, out, err)
    if json_output:
        session.json = True
    return session


def _fail(message: str, code: int = 1) -> typer.Exit:
    _, err = _consoles()
    err.print(Text(f"error: {message}", style="bold red"))
    return typer.Exit(code)


def _in_cli_terms(exc: OvertakeError) -> str:
    """What went wrong, said to a person at a terminal (the SDK's message names the HTTP request)."""
    if isinstance(exc, OutcomeUnknown):
        return (
            f"the connection to the coordinator at {exc.url} broke before it answered, so it may or may not have "
            "done it; look (e.g. 'overtake checkpoints list JOB') before trying again"
        )
    if isinstance(exc, CoordinatorUnreachable):
        cause = exc.__cause__
        why = f" ({type(cause).__name__}: {cause})" if cause is not None and str(cause) else ""
        tries = f"{CLI_RETRIES + 1} times"
        if isinstance(cause, httpx.ReadTimeout | httpx.WriteTimeout):  # connected, then no answer in time
            return (
                f"the coordinator at {exc.url} took the request but did not answer within {CLI_TIMEOUT:g} s, "
                f"{tries}: it may be overloaded or stuck; its /readyz says whether it is ready"
            )
        if isinstance(cause, httpx.RemoteProtocolError | httpx.ReadError):
            return (
                f"the coordinator at {exc.url} closed the connection without a complete answer, {tries}{why}: it "
                "may be restarting, or that address is not an Overtake coordinator; try again in a moment"
            )
        return (
            f"cannot reach the coordinator at {exc.url}{why}. Is it running? Start one with 'overtake serve', or "
            "point to yours with --url or OVERTAKE_URL."
        )
    message = str(exc)
    for api, command in CLI_HINTS:
        message = message.replace(api, command)
    return message


CLI_HINTS = (("list jobs with GET /api/v1/jobs", "list them with 'overtake jobs list'"),)
"""The coordinator's hints that name an API request, and the command that does it here."""


def reports_errors(func: F) -> F:
    """Turn the SDK's errors into a red message and exit status 1 instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OvertakeError as exc:
            raise _fail(_in_cli_terms(exc)) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


JobArg = Annotated[int, typer.Argument(help="Job id.", show_default=False)]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of a table.")]
CheckpointArg = Annotated[int, typer.Argument(help="Checkpoint id.", show_default=False)]
Limit = Annotated[int, typer.Option(help="How many to show.", min=1, max=1000)]
Offset = Annotated[int, typer.Option(help="How many of the newest to skip.", min=0)]
