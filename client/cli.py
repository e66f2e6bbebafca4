"""The ``overtake`` command line: run the coordinator, and look at and steer jobs and checkpoints through the SDK.

Tables for people by default; ``--json`` prints the API's JSON (JSON Lines for ``events``). An error answered by
the coordinator is printed in red and exits 1; a missing optional part (demo, bench) exits 2.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.text import Text

from client import cli_format as fmt
from client.errors import OvertakeError
from client.models import BarrierPolicy, CheckpointStatus, JobStatus
from client.sync import OvertakeClient

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
        return OvertakeClient(self.url, token=self.token)

    def show(self, value: BaseModel, render: Callable[[Any], RenderableType]) -> None:
        """The model as JSON with --json, else as ``render`` draws it."""
        if self.json:
            typer.echo(value.model_dump_json(indent=2))
        else:
            self.out.print(render(value))


def _consoles() -> tuple[Console, Console]:
    # markup off: server text such as 'src[0]' must print as it is
    return Console(markup=False, highlight=False), Console(stderr=True, markup=False, highlight=False)


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


def _session(ctx: typer.Context) -> Session:
    session = ctx.find_object(Session)
    if session is None:  # a command invoked without the group (tests, embedding)
        out, err = _consoles()
        session = Session(None, None, False, out, err)
    return session


def _fail(message: str, code: int = 1) -> typer.Exit:
    _, err = _consoles()
    err.print(Text(f"error: {message}", style="bold red"))
    return typer.Exit(code)


def reports_errors(func: F) -> F:
    """Turn the SDK's errors into a red message and exit status 1 instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OvertakeError as exc:
            raise _fail(str(exc)) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


JobArg = Annotated[int, typer.Argument(help="Job id.", show_default=False)]
CheckpointArg = Annotated[int, typer.Argument(help="Checkpoint id.", show_default=False)]
Limit = Annotated[int, typer.Option(help="How many to show.", min=1, max=1000)]
Offset = Annotated[int, typer.Option(help="How many of the newest to skip.", min=0)]


# ------------------------------------------------------------------------------------------- server


@app.command()
@reports_errors
def serve(
    host: Annotated[
        str | None, typer.Option(help="Interface to bind (default OVERTAKE_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default OVERTAKE_PORT or 8321).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
) -> None:
    """Run the coordinator (one process), configured by OVERTAKE_* environment variables."""
    settings = _import("app.settings", "the coordinator").Settings()
    _import("app.main", "the coordinator")
    import uvicorn

    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        log_level=log_level.lower(),
        workers=1,
    )


@db_app.command("upgrade")
@reports_errors
def db_upgrade(ctx: typer.Context) -> None:
    """Upgrade the database schema to the newest migration."""
    settings = _import("app.settings", "the coordinator").Settings()
    migrate = _import("app.db.migrate", "the database migrations")
    result = migrate.upgrade(settings)
    if inspect.isawaitable(result):
        import asyncio

        asyncio.run(result)
    _session(ctx).out.print(Text(f"database {settings.effective_database_url} is up to date", style="green"))


# ------------------------------------------------------------------------------------------- jobs


@jobs_app.command("list")
@reports_errors
def jobs_list(
    ctx: typer.Context,
    status: Annotated[
        JobStatus | None, typer.Option(help="Only jobs in this status.", case_sensitive=False)
    ] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> None:
    """List jobs, newest first."""
    s = _session(ctx)
    with s.client() as c:
        s.show(c.list_jobs(status=status, limit=limit, offset=offset), fmt.jobs_table)


@jobs_app.command("show")
@reports_errors
def jobs_show(ctx: typer.Context, job_id: JobArg) -> None:
    """Show a job: status, checkpoint configuration and graph."""
    s = _session(ctx)
    with s.client() as c:
        s.show(c.get_job(job_id), fmt.job_view)


@jobs_app.command("cancel")
@reports_errors
def jobs_cancel(ctx: typer.Context, job_id: JobArg) -> None:
    """Cancel a job; its pending checkpoints are aborted."""
    s = _session(ctx)
    with s.client() as c:
        job = c.cancel_job(job_id)
    s.show(job, lambda j: Text(f"job {j.id} {j.name}: ").append_text(fmt.status(j.status)))


# ------------------------------------------------------------------------------------------- checkpoints


@checkpoints_app.command("list")
@reports_errors
def checkpoints_list(
    ctx: typer.Context,
    job_id: JobArg,
    status: Annotated[
        CheckpointStatus | None, typer.Option(help="Only checkpoints in this status.", case_sensitive=False)
    ] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> None:
    """List a job's checkpoints and savepoints, newest first."""
    s = _session(ctx)
    with s.client() as c:
        page = c.list_checkpoints(job_id, status=status, limit=limit, offset=offset)
    s.show(
        page,
        lambda p: fmt.checkpoints_table(p.items, f"{len(p.items)} of {p.total} checkpoints of job {job_id}"),
    )


@checkpoints_app.command("show")
@reports_errors
def checkpoints_show(ctx: typer.Context, job_id: JobArg, checkpoint_id: CheckpointArg) -> None:
    """Show one checkpoint with a row per acknowledged subtask."""
    s = _session(ctx)
    with s.client() as c:
        s.show(c.get_checkpoint(job_id, checkpoint_id), fmt.checkpoint_view)


@checkpoints_app.command("stats")
@reports_errors
def checkpoints_stats(ctx: typer.Context, job_id: JobArg) -> None:
    """Counts, a summary (min/avg/percentiles/max) and the recent history of a job's checkpoints."""
    s = _session(ctx)
    with s.client() as c:
        s.show(c.checkpoint_stats(job_id), fmt.stats_view)


@checkpoints_app.command("trigger")
@reports_errors
def checkpoints_trigger(
    ctx: typer.Context,
    job_id: JobArg,
    policy: Annotated[
        BarrierPolicy | None, typer.Option(help="Barrier policy for this checkpoint only.")
    ] = None,
) -> None:
    """Trigger a checkpoint of the job's current attempt now."""
    s = _session(ctx)
    with s.client() as c:
        s.show(c.trigger_checkpoint(job_id, policy=policy), lambda cp: fmt.checkpoint_line(cp, "triggered"))


@app.command()
@reports_errors
def savepoint(
    ctx: typer.Context,
    job_id: JobArg,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the job once the savepoint completes.")] = False,
) -> None:
    """Trigger a savepoint (always aligned, never collected automatically)."""
    s = _session(ctx)
    with s.client() as c:
        s.show(c.trigger_savepoint(job_id, stop=stop), lambda cp: fmt.checkpoint_line(cp, "triggered"))


@app.command("restore-plan")
@reports_errors
def restore_plan(
    ctx: typer.Context,
    job_id: JobArg,
    checkpoint: Annotated[
        int | None,
        typer.Option("--checkpoint", help="Checkpoint or savepoint id (default: the latest completed)."),
    ] = None,
) -> None:
    """Show what a restart would restore, per subtask."""
    s = _session(ctx)
    with s.client() as c:
        s.show(c.restore_plan(job_id, checkpoint_id=checkpoint), fmt.restore_plan_view)


@app.command()
@reports_errors
def events(
    ctx: typer.Context,
    job_id: JobArg,
    after: Annotated[
        int | None, typer.Option(help="Start after this event id (default: from the beginning).")
    ] = None,
    count: Annotated[
        int | None, typer.Option(help="Stop after this many events (default: follow until Ctrl-C).", min=1)
    ] = None,
) -> None:
    """Follow a job's events as they happen (Ctrl-C to stop); reconnects and resumes on its own."""
    s = _session(ctx)
    with s.client() as c:
        for seen, event in enumerate(c.events(job_id, after=after), start=1):
            if s.json:
                typer.echo(event.model_dump_json())
            else:
                s.out.print(fmt.event_line(event), soft_wrap=True)
            if count is not None and seen >= count:
                break


# ------------------------------------------------------------------------------------------- demo, bench

_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def demo(ctx: typer.Context) -> None:
    """Run the PySpark demo pipeline (arguments are passed to it; try 'overtake demo --help')."""
    raise typer.Exit(_run_main("spark_plugin.demo", "the Spark demo", ctx.args))


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """Run the benchmarks (arguments are passed to them; try 'overtake bench --help')."""
    raise typer.Exit(_run_main("benchmarks.cli", "the benchmarks", ctx.args))


def _import(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise _fail(f"{what} ({module}) is not available in this installation", code=2) from None
        raise


def _run_main(module: str, what: str, argv: list[str]) -> int:
    entry = getattr(_import(module, what), "main", None)
    if entry is None:
        raise _fail(f"{module} has no main(argv) function", code=2)
    result = entry(list(argv))
    return result if isinstance(result, int) else 0


def main() -> None:
    """Console-script entry point."""
    if os.environ.get("OVERTAKE_DEBUG"):
        app()
        return
    try:
        app()
    except Exception as exc:  # an unexpected bug: one line, not a traceback (OVERTAKE_DEBUG=1 shows it)
        _fail(f"{type(exc).__name__}: {exc} (set OVERTAKE_DEBUG=1 for the traceback)")
        sys.exit(1)
