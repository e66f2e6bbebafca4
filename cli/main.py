"""The ``overtake`` command line: run the coordinator, and look at and steer jobs and checkpoints through the SDK.

Tables for people by default, fitted to the terminal's width (``COLUMNS`` too); ``--json`` (before or after the
command) prints the API's JSON (JSON Lines for ``events``). An error answered by the coordinator is printed in red
and exits 1, and so is a coordinator that cannot be reached (said within a second or two); a missing optional part
(demo, bench) exits 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.text import Text

from cli import format as fmt
from cli.app import (  # noqa: F401  (CLI_RETRIES, CLI_MAX_BACKOFF, CLI_TIMEOUT: read by the tests from here)
    CLI_MAX_BACKOFF,
    CLI_RETRIES,
    CLI_TIMEOUT,
    CheckpointArg,
    JobArg,
    JsonFlag,
    Limit,
    Offset,
    Session,
    _consoles,
    _fail,
    _session,
    app,
    checkpoints_app,
    db_app,
    jobs_app,
    reports_errors,
)
from contract.models import BarrierPolicy, CheckpointStatus, JobStatus

# ------------------------------------------------------------------------------------------- server


@app.command()
@reports_errors
def serve(
    host: Annotated[
        str | None, typer.Option(help="Interface to bind (default OVERTAKE_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default OVERTAKE_PORT or 8321).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Embedded database and blobs (default OVERTAKE_DATA_DIR or .overtake), e.g. a demo's."),
    ] = None,
) -> None:
    """Run the coordinator (one process), configured by OVERTAKE_* environment variables; prints the UI's address
    once it is ready."""
    import uvicorn

    from app.observability import setup_logging
    from app.settings import Settings  # the coordinator's modules load only for the commands that run it

    if data_dir is not None:
        os.environ["OVERTAKE_DATA_DIR"] = str(data_dir)  # the app's factory reads its settings again
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


@jobs_app.command("metrics")
@reports_errors
def jobs_metrics(ctx: typer.Context, job_id: JobArg, json_output: JsonFlag = False) -> None:
    """Live metrics of the current attempt's subtasks: records/s, backpressure, watermark lag, and a restored
    subtask's replay (bytes replayed of those it restored, or how long it took)."""
    _session(ctx, json_output).show_call(lambda c: c.live_metrics(job_id), fmt.live_table)


@jobs_app.command("attempts")
@reports_errors
def jobs_attempts(
    ctx: typer.Context, job_id: JobArg, limit: Limit = 50, offset: Offset = 0, json_output: JsonFlag = False
) -> None:
    """A job's attempts, newest first: what each restored, why it started, and the current attempt's recovery
    phases (detect, relaunch, restore, replay)."""
    _session(ctx, json_output).show_call(lambda c: c.list_attempts(job_id, limit=limit, offset=offset), fmt.attempts_table)


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


@checkpoints_app.command("export-arrow")
@reports_errors
def checkpoints_export_arrow(
    ctx: typer.Context,
    job_id: JobArg,
    checkpoint_id: CheckpointArg,
    out: Annotated[Path, typer.Option("--out", help="Directory to write one Arrow IPC file per segment into.")],
) -> None:
    """Write the Arrow batches a checkpoint holds in flight on batch edges as Arrow IPC files (pyarrow, DuckDB).

    Records are unpickled: export checkpoints of jobs you trust."""
    s = _session(ctx)
    with _optional("the channel-state export (pyarrow)"):
        import pyarrow  # noqa: F401

        from spark_plugin.task.channel_state_export import export_arrow, plan_segments
    with s.client() as c:
        plan = c.restore_plan(job_id, checkpoint_id=checkpoint_id)
        done = export_arrow(
            plan_segments(plan), lambda blob, start, end: c.download_blob(job_id, blob, start, end), out,
            plan.checkpoint_id,
        )
    written = [d for d in done if d.path is not None]
    for d in written:
        s.out.print(f"{d.path}: {d.rows:,} rows in {d.batches} batches ({d.vertex}[{d.subtask}] {d.direction} "
                    f"{d.channel})")
    others = sum(d.other_records for d in done)
    s.out.print(f"{len(written)} of {len(done)} segments of checkpoint {plan.checkpoint_id} held Arrow batches"
                + (f"; {others:,} other records left out" if others else ""))


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
            "last-barrier), kafka (15. latency from produce time to a read_committed reader and throughput through "
            "Kafka in and out under backpressure, unaligned and aligned exactly-once against unaligned "
            "at-least-once; starts Tansu). Numbers work too: `overtake bench 8 9`. `overtake bench soak --cases N` runs the "
            "randomized rescale soak instead (no Spark; alone).",
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
    cases: Annotated[
        int, typer.Option(help="soak: how many randomized cases (each a checkpointed run and 1-2 rescales).", min=1)
    ] = 100,
    seed: Annotated[int, typer.Option(help="soak: seed of the first case (case n has seed + n).")] = 0,
    repeat: Annotated[int, typer.Option(help="soak: run every case this many times.", min=1)] = 1,
    soak_seconds: Annotated[
        float | None,
        typer.Option("--soak-seconds", help="soak: stop starting cases after this many seconds.", min=1,
                     show_default=False),
    ] = None,
    keep: Annotated[
        Path | None,
        typer.Option(help="soak: folder to pickle each failed case's checkpoints, plans and output into.",
                     show_default=False),
    ] = None,
) -> None:
    """Run the FLIP-76 test plan on local Spark with the coordinator on PostgreSQL; write a markdown report and PNG
    plots into the results folder. `overtake bench soak --cases N`: the randomized rescale soak (benchmarks/soak.py)."""
    if scenarios and "soak" in scenarios:
        if len(scenarios) > 1:
            raise typer.BadParameter("soak runs alone: `overtake bench soak --cases N`")
        with _optional("the benchmarks (benchmarks.soak)"):
            from benchmarks.soak import soak

        totals = soak(cases, seed, repeat, keep=str(keep) if keep else None, seconds=soak_seconds)
        typer.echo(totals.summary())
        raise typer.Exit(1 if totals.failures else 0)
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


if __name__ == "__main__":  # python -m cli.main, as the overtake command
    main()
