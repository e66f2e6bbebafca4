"""The coordinator's FastAPI application: wiring of settings, context, background workers, routes and errors."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from sqlalchemy import text

from app import __doc__ as APP_DOC
from app.api import acks, checkpoints, jobs, live, ops, subtasks, ui
from app.api.ack_fastpath import AckFastPath
from app.api.error_handlers import install_error_handlers
from app.api.guards import CrossOriginGuard, RequestGuard
from app.auth import Auth
from app.blobstore import StoreTaken
from app.db.migrate import upgrade
from app.domain.acks import AckCommitter
from app.domain.context import Context
from app.domain.live_metrics import LiveMetricsStore
from app.observability import setup_logging
from app.scheduler import Scheduler
from app.settings import Settings

log = logging.getLogger("overtake")
CLAIM_TIMEOUT = 15.0  # seconds the start waits for the blob store to say who holds it
UI_DIST = Path(__file__).parent / "ui" / "dist"
VERSION = "0.1.0"


ROUTERS = (jobs.router, checkpoints.router, acks.router, subtasks.router, live.router, ops.router, ui.router)


def _operation_id(route: APIRoute) -> str:
    return route.name


async def _warn_without_autovacuum(ctx: Context) -> None:
    """PostgreSQL without autovacuum never learns the coordinator's tables' sizes: its plans, some cached for a
    connection's life, stay those made on empty tables, and a checkpoint's statements cost more as its job's history
    grows (at a 10 ms interval, 11 -> 13 ms between triggers over 2 minutes, flat with an ANALYZE every 10 s)."""
    if ctx.db.is_sqlite:
        return
    try:
        async with ctx.db.session(readonly=True) as s:
            autovacuum = (await s.execute(text("SHOW autovacuum"))).scalar()
    except Exception as exc:  # noqa: BLE001 - advice only: the coordinator runs either way
        log.debug("could not read PostgreSQL's autovacuum setting: %s", exc)
        return
    if str(autovacuum).lower() in ("off", "false", "0"):
        log.warning(
            "PostgreSQL's autovacuum is off: the database never analyzes the coordinator's tables, and plans made "
            "on them while empty make each checkpoint cost more as its job's history grows; turn autovacuum on, "
            "or run ANALYZE on the coordinator's database every few minutes"
        )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    setup_logging(settings.log_level, settings.effective_log_format)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx: Context = app.state.ctx
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        if settings.auto_migrate:
            await asyncio.to_thread(upgrade, settings.effective_database_url)
        await ctx.bus.start()
        await _claim_store(ctx)
        await _warn_without_autovacuum(ctx)
        committer = AckCommitter(ctx)
        await committer.start()
        app.state.committer = committer
        scheduler = Scheduler(ctx)
        app.state.scheduler = scheduler
        if settings.scheduler_enabled:
            await scheduler.start()
        if not settings.admin_token:
            log.warning(
                "OVERTAKE_ADMIN_TOKEN is not set: the coordinator runs without authentication; browsers may change "
                "state only from its own origin%s (set OVERTAKE_ADMIN_TOKEN for tokens)",
                f" and {', '.join(settings.cors_origins)}" if settings.cors_origins else "",
            )
        log.info(
            "coordinator ready",
            extra={
                "database": _redact(settings.effective_database_url),
                "blobs": settings.effective_blob_url,
                "event_bus": _redact(settings.event_bus_url),
            },
        )
        try:
            yield
        finally:
            await scheduler.stop()
            await committer.stop()
            await ctx.close()

    app = FastAPIOffline(
        title="Overtake checkpoint coordinator",
        description=(APP_DOC or "") + " Issues checkpoint ids, tracks acks and channel-state manifests, "
        "applies barrier policies, completes, aborts, collects and plans recovery.",
        version=VERSION,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        redoc_url=None,
    )
    ctx = Context(settings)
    app.state.ctx = ctx
    app.state.settings = settings
    app.state.auth = Auth(ctx)
    app.state.live_metrics = ctx.live = LiveMetricsStore()
    ctx.bus.add_listener(ctx.live.heard)

    install_error_handlers(app)

    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(CrossOriginGuard, enabled=not settings.admin_token, allowed_origins=settings.cors_origins)
    app.add_middleware(  # every request, the ack fast path included
        RequestGuard,
        max_body=settings.max_request_body,
        max_upload=settings.max_upload_size,
        retries=settings.db_retries,
        body_timeout=settings.body_timeout,
    )
    app.add_middleware(  # answers preflights; an empty list allows no other origin
        CORSMiddleware,
        allow_origins=settings.cors_origins,
        allow_methods=["*"],
        allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "X-Overtake-Client", "X-Overtake-Sha256"],
        expose_headers=["Retry-After", "Content-Range", "X-Overtake-Sha256"],
    )
    app.add_middleware(AckFastPath, max_body=settings.max_request_body, body_timeout=settings.body_timeout)  # the hot path, before the others

    _document_errors(app)

    if (UI_DIST / "index.html").exists():
        app.mount("/ui", StaticFiles(directory=UI_DIST, html=True), name="ui")

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        page = UI_DIST / "index.html"
        if page.exists():
            return HTMLResponse(page.read_text())
        return HTMLResponse(
            "<!doctype html><title>Overtake</title><h1>Overtake checkpoint coordinator</h1>"
            '<p>API: <a href="/docs">/docs</a> · <a href="/openapi.json">/openapi.json</a> · '
            '<a href="/metrics">/metrics</a></p>'
        )

    return app


def _document_errors(app: FastAPI) -> None:
    """Describe every error as the one JSON error shape the app really sends (not FastAPI's default)."""
    from fastapi.openapi.utils import get_openapi

    from contract.models import AckBatch, ErrorResponse, SubtaskAck, SubtaskReport

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        spec = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        error_schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in error_schema.pop("$defs", {}).items():
            schemas[name] = sub
        schemas["ErrorResponse"] = error_schema
        for model in (SubtaskAck, AckBatch, SubtaskReport):  # bodies the ack routes parse themselves, by name
            body_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in body_schema.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas.setdefault(model.__name__, body_schema)
        spec["components"]["securitySchemes"] = {
            "adminToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "OVERTAKE_ADMIN_TOKEN. When the coordinator runs without it, no token is needed.",
            },
            "taskToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "The task token of the job's current attempt (from starting the attempt), or the "
                "admin token. It stops working when the attempt or the job ends.",
            },
        }
        security = _route_security(app)
        ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
        for path, operations in spec.get("paths", {}).items():
            for op in operations.values():
                op["security"] = security.get(op.get("operationId"), [])
                responses = op.setdefault("responses", {})
                if path.startswith("/api/"):
                    responses["422"] = {
                        "description": "Invalid request: the message names the problem.",
                        "content": ref,
                    }
                    responses["4XX"] = {
                        "description": "Refused: not found, conflict, unauthorized, forbidden, too large.",
                        "content": ref,
                    }
                else:
                    responses.pop("422", None)
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


async def _claim_store(ctx: Context) -> None:
    """Claim an explicitly configured blob store for this deployment (`blobstore.claim`): another deployment's
    store stops the start, with the message saying what to do. A store that does not answer within the bound is
    claimed later, before anything is written into it or deleted from it."""
    if ctx.cleaner.owner is None:
        return
    try:
        await asyncio.wait_for(ctx.cleaner.ensure_claimed(), CLAIM_TIMEOUT)
    except StoreTaken:
        raise
    except Exception as exc:  # noqa: BLE001 - unreachable for now: claimed before its first write or delete
        log.warning("could not check who holds blob store %s (%r); checked again before it is used", ctx.store.url, exc)


def _route_security(app: FastAPI) -> dict[str, list[dict]]:
    """operationId -> its OpenAPI security: the admin token, a task token (or admin), or none (operations)."""
    from app.api.deps import admin_only, job_access, task_token

    out: dict[str, list[dict]] = {}
    for route in (r for router in ROUTERS for r in router.routes):
        if not isinstance(route, APIRoute):
            continue
        # the route's dependencies, whether declared on the decorator or as a parameter (`TokenAttempt`)
        deps = {d.call for d in route.dependant.dependencies}
        if admin_only in deps:
            out[route.name] = [{"adminToken": []}]
        elif job_access in deps or task_token in deps or route.name in ("ack", "ack_batch"):
            # (the ack routes check tokens themselves)
            out[route.name] = [{"taskToken": []}, {"adminToken": []}]
        else:
            out[route.name] = []
    return out


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':')[0]}:***@{host}" if ":" in creds else url
    return url
