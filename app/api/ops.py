"""Operational routes: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.deps import CtxDep
from app.observability import REGISTRY
from contract.models import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up. Does no database work (the benchmark's no-database ceiling)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(ctx: CtxDep):
    """The database, the event bus and the blob store are reachable."""
    checks: dict[str, str] = {}
    for name, probe in (
        ("database", ctx.db.ping),
        ("event_bus", ctx.bus.ping),
        ("blob_store", ctx.store.check),
    ):
        try:
            await probe()
            checks[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            checks[name] = f"unavailable: {exc}"
    ok = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ok else "unavailable", checks=checks)
    return body if ok else JSONResponse(body.model_dump(), status_code=503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
