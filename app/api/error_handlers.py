"""The coordinator's answers to errors, in the one JSON error shape (``app.errors.error_payload``): domain errors,
invalid requests, routing refusals, clients gone mid-body, and anything unexpected (a 500 that names only the
exception's type; the traceback goes to the log)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from app.errors import DomainError, Internal, error_payload, invalid_from

log = logging.getLogger("overtake")


def _error(exc: DomainError) -> JSONResponse:
    return JSONResponse(
        error_payload(exc.code, exc.message, exc.details), status_code=exc.status_code, headers=exc.headers or None
    )


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` in the one error shape."""

    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(invalid_from(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 403: "forbidden"}
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404 and message == "Not Found":
            message = "no such route; the API is under /api/v1 (see /docs)"
        refused = DomainError(message)
        refused.status_code, refused.code = exc.status_code, codes.get(exc.status_code, "http_error")
        refused.headers = dict(exc.headers or {})  # e.g. Allow on a 405
        return _error(refused)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        # a subtask that died (or gave up) while it sent a body: nothing was stored, and nobody reads the answer
        log.info("%s %s: the client closed the connection before its body arrived whole", request.method,
                 request.url.path)
        return _error(DomainError("the client closed the connection before its body arrived whole; nothing was stored"))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _error(Internal(f"internal error ({type(exc).__name__}); see the coordinator's log"))
