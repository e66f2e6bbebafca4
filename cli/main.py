"""The ``overtake`` command line: run the coordinator, and look at and steer jobs and checkpoints through the SDK.

Tables for people by default, fitted to the terminal's width (``COLUMNS`` too); ``--json`` (before or after the
command) prints the API's JSON (JSON Lines for ``events``). An error answered by the coordinator is printed in red
and exits 1, and so is a coordinator that cannot be reached (said within a second or two); a missing optional part
(demo, bench) exits 2.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import httpx
import typer
from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.text import Text

from cli import format as fmt
from client.errors import CoordinatorUnreachable, OutcomeUnknown, OvertakeError
from client.sync import OvertakeClient
from contract.models import BarrierPolicy, CheckpointStatus, JobStatus

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
    return str(exc)


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
    """Run the coordinator (one process), configured by OVERTAKE_* environment variables; prints the UI's address
    once it is ready."""
    import uvicorn

    from app.observability import setup_logging
    from app.settings import Settings  # the coordinator's modules load only for the commands that run it

    settings = Settings()
    host = host or settings.host
    port = port or settings.port
    # one log format for uvicorn's lines and the coordinator's (OVERTAKE_LOG_FORMAT)
    setup_logging(settings.log_level, settings.effective_log_format)
    _announce_when_ready(host, port, settings)
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=host,
        port=port,
        log_level=log_level.lower(),
        log_config=None,
        workers=1,
    )


def _announce_when_ready(host: str, port: int, settings: Any, timeout: float = 120.0) -> None:
    """Print the UI's address on stdout as soon as the coordinator answers /readyz (waits at most ``timeout``)."""
    import threading
    import time

    import httpx

    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url = f"http://{shown}:{port}"

    def wait() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=1.0).status_code == 200:
                    where = f"data in {settings.data_dir}" if not settings.database_url else "its own database"
                    print(f"Overtake coordinator ready: the UI at {url}/ , the API at {url}/docs ({where})",
                          flush=True)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    threading.Thread(target=wait, name="announce", daemon=True).start()


@db_app.command("upgrade")
@reports_errors
def db_upgrade(ctx: typer.Context) -> None:
    """Upgrade the database schema to the newest migration."""
    from app.db.migrate import upgrade
    from app.settings import Settings

    settings = Settings()
    upgrade(settings.effective_database_url)
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
    json_output: JsonFlag = False,
) -> None:
    """List jobs, newest first."""
    _session(ctx, json_output).show_call(lambda c: c.list_jobs(status=status, limit=limit, offset=offset), fmt.jobs_table)


@jobs_app.command("show")
@reports_errors
def jobs_show(ctx: typer.Context, job_id: JobArg, json_output: JsonFlag = False) -> None:
    """Show a job: status, checkpoint configuration and graph."""
    _session(ctx, json_output).show_call(lambda c: c.get_job(job_id), fmt.job_view)


@jobs_app.command("cancel")
@reports_errors
def jobs_cancel(ctx: typer.Context, job_id: JobArg, json_output: JsonFlag = False) -> None:
    """Cancel a job; its pending checkpoints are aborted."""
    s = _session(ctx, json_output)
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
    json_output: JsonFlag = False,
) -> None:
    """List a job's checkpoints and savepoints, newest first."""
    s = _session(ctx, json_output)
    with s.client() as c:
        page = c.list_checkpoints(job_id, status=status, limit=limit, offset=offset)
    s.show(
        page,
        lambda p: fmt.checkpoints_table(p.items, f"{len(p.items)} of {p.total} checkpoints of job {job_id}"),
    )


@checkpoints_app.command("show")
@reports_errors
def checkpoints_show(
    ctx: typer.Context, job_id: JobArg, checkpoint_id: CheckpointArg, json_output: JsonFlag = False
) -> None:
    """Show one checkpoint with a row per acknowledged subtask."""
    _session(ctx, json_output).show_call(lambda c: c.get_checkpoint(job_id, checkpoint_id), fmt.checkpoint_view)


@checkpoints_app.command("stats")
@reports_errors
def checkpoints_stats(ctx: typer.Context, job_id: JobArg, json_output: JsonFlag = False) -> None:
    """Counts, a summary (min/avg/percentiles/max) and the recent history of a job's checkpoints."""
    _session(ctx, json_output).show_call(lambda c: c.checkpoint_stats(job_id), fmt.stats_view)


@checkpoints_app.command("trigger")
@reports_errors
def checkpoints_trigger(
    ctx: typer.Context,
    job_id: JobArg,
    policy: Annotated[
        BarrierPolicy | None, typer.Option(help="Barrier policy for this checkpoint only.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Trigger a checkpoint of the job's current attempt now."""
    s = _session(ctx, json_output)
    with s.client() as c:
        s.show(c.trigger_checkpoint(job_id, policy=policy), lambda cp: fmt.checkpoint_line(cp, "triggered"))


@app.command()
@reports_errors
def savepoint(
    ctx: typer.Context,
    job_id: JobArg,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the job once the savepoint completes.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Trigger a savepoint (always aligned, never collected automatically)."""
    s = _session(ctx, json_output)
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
    json_output: JsonFlag = False,
) -> None:
    """Show what a restart would restore, per subtask."""
    _session(ctx, json_output).show_call(lambda c: c.restore_plan(job_id, checkpoint_id=checkpoint), fmt.restore_plan_view)


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
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON Lines instead of text.")] = False,
) -> None:
    """Follow a job's events as they happen (Ctrl-C to stop); reconnects and resumes on its own."""
    s = _session(ctx, json_output)
    with s.client() as c:
        for seen, event in enumerate(c.events(job_id, after=after), start=1):
            if s.json:
                typer.echo(event.model_dump_json())
            else:
                s.out.print(fmt.event_line(event), soft_wrap=True)
            if count is not None and seen >= count:
                break


# ------------------------------------------------------------------------------------------- demo, bench


class Policy(str, Enum):
    unaligned = "unaligned"
    aligned = "aligned"


@app.command()
def demo(
    coordinator: Annotated[
        str | None,
        typer.Option("--coordinator", help="URL of a running coordinator (default: start an embedded one).",
                     show_default=False),
    ] = None,
    data_dir: Annotated[
        Path,
        typer.Option("--data-dir", help="Where the embedded coordinator keeps its data; kept after the run."),
    ] = Path(".overtake/demo"),
    port: Annotated[int, typer.Option(help="Port of the embedded coordinator (another free one if taken).")] = 8321,
    duration: Annotated[float, typer.Option(help="Seconds per run.", min=1)] = 30.0,
    interval: Annotated[int, typer.Option(help="Checkpoint interval (ms).", min=10)] = 1000,
    parallelism: Annotated[int, typer.Option(help="Subtasks per operator chain.", min=1, max=16)] = 2,
    record_cost: Annotated[float, typer.Option(help="Milliseconds the keyed stage spends per record.", min=0)] = 1.0,
    payload: Annotated[int, typer.Option(help="Bytes of padding per record.", min=0)] = 100,
    keys: Annotated[int, typer.Option(help="Distinct keys.", min=1)] = 64,
    skew: Annotated[float, typer.Option(help="Zipf exponent of the key distribution.", min=0)] = 0.8,
    buffer_size: Annotated[int, typer.Option(help="Network buffer size in bytes.", min=256)] = 32 * 1024,
    debloat_target: Annotated[
        float | None,
        typer.Option(help="Buffer debloating: seconds of throughput the in-flight buffers hold (e.g. 1.0); "
                     "default off, buffers keep --buffer-size.", min=0.001, show_default=False),
    ] = None,
    only: Annotated[Policy | None, typer.Option(help="Run one policy only.", show_default=False)] = None,
    event_time: Annotated[
        bool,
        typer.Option("--event-time/--no-event-time",
                     help="Then run the event-time scenario: windowed counts with watermarks and late records."),
    ] = True,
    wait: Annotated[
        bool | None,
        typer.Option(
            "--wait/--no-wait",
            help="Keep the embedded coordinator (and its UI) running after the demo until Ctrl-C. "
            "Default: when run in a terminal.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the demo: a backpressured pipeline on local Spark, checkpointed unaligned and then aligned, side by side;
    the UI shows it live."""
    with _optional("the Spark demo (cli.demo, which needs PySpark: pip install 'overtake[spark]')"):
        from cli.demo import DemoOptions, run
    options = DemoOptions(
        coordinator=coordinator, data_dir=data_dir, port=port, duration=duration, interval=interval,
        parallelism=parallelism, record_cost=record_cost, payload=payload, keys=keys, skew=skew,
        buffer_size=buffer_size, debloat_target=debloat_target, only=only.value if only else None,
        event_time=event_time,
        wait=sys.stdin.isatty() and sys.stdout.isatty() if wait is None else wait,
    )
    raise typer.Exit(run(options))


@app.command()
def bench(
    scenarios: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[SCENARIO]...",
            help="Which scenarios to run (default all): checkpoints (1. checkpoint duration under backpressure), "
            "throughput-bp (2. throughput under backpressure), throughput (3. without backpressure), disk "
            "(4. channel-state write bandwidth), acks (5. coordinator ack throughput), timers (6. checkpoints while "
            "event-time timers fire), state (7. state straight into the blob store against state through the "
            "coordinator), inflight (8. persisted in-flight bytes per unaligned checkpoint and recovery time, "
            "fixed buffers against buffer debloating to 1 s and 0.1 s), adaptive (9. the adaptive policy against "
            "the fixed ones when backpressure comes and goes), recovery-checkpoints (10. time to the first completed "
            "checkpoint after a restore with large in-flight state, with and without checkpoints during recovery), "
            "incremental (11. bytes written per checkpoint under "
            "sustained backpressure, incremental channel state off and on), budget (12. checkpoint duration and persisted "
            "in-flight bytes without and with an in-flight budget per subtask), concurrent (13. concurrent unaligned "
            "checkpoints: max_concurrent 1 against 2 with a 20 ms interval under backpressure), last-barrier (14. "
            "persisted bytes and duration of a flat_map with 100 outputs per input, first-barrier unaligned against "
            "last-barrier). Numbers work too: `overtake bench 8 9`.",
            show_default=False,
        ),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Reduced settings: the whole run in under 5 minutes.")] = False,
    out: Annotated[Path, typer.Option(help="Results folder.")] = Path("bench-results"),
    postgres: Annotated[
        str | None,
        typer.Option(help="PostgreSQL admin URL; each run creates and drops its own database.", show_default=False),
    ] = None,
    seconds: Annotated[
        float | None,
        typer.Option(help="Length of each backpressured run (scenarios 1-2), timers run (6), policy run (9) and "
                     "incremental run (11), and each concurrent run (13).", min=1,
                     show_default=False),
    ] = None,
    depths: Annotated[
        str | None, typer.Option(help="Shuffle depths of scenario 1, e.g. 1,3 (default 1,2,3).", show_default=False)
    ] = None,
    policies: Annotated[
        str | None, typer.Option(help="Policies of scenario 1, comma-separated (default all three).", show_default=False)
    ] = None,
) -> None:
    """Run the FLIP-76 test plan on local Spark with the coordinator on PostgreSQL; write a markdown report and PNG
    plots into the results folder."""
    with _optional("the benchmarks (benchmarks.cli)"):
        from benchmarks.cli import BenchUsageError, bench_args
        from benchmarks.cli import main as run_bench
    try:
        args = bench_args(list(scenarios or []), quick, out, postgres, seconds, depths, policies)
    except BenchUsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    raise typer.Exit(run_bench(args))


@contextmanager
def _optional(what: str) -> Iterator[None]:
    """Import an optional part of the installation (PySpark, the benchmarks); exit 2 when it is missing."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise _fail(f"{what} is not available in this installation: no module {exc.name!r}", code=2) from None


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
