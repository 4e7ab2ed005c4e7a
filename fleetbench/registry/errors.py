"""Every error the registry answers for, mapped to its answer in one place: routes raise
the domain's errors and never translate them. A request the schema refuses: 422 with
`detail` a list naming each field (FastAPI's shape, always writable as JSON); a report or
plan this registry's rules refuse: 422 with `detail` a sentence; a run id or a plan changed
under the request: 409; the database busy or gone: 503 with Retry-After. The OpenAPI schema
declares the two shapes of 422 where a route answers both (responses.refused)."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.ingest.answers import ReportRefused, RunConflict
from fleetbench.registry.plans import PlanChanged, PlanRefused

__all__ = ["DATABASE_UNAVAILABLE", "REFUSALS", "database_unavailable", "install_error_answers"]

DATABASE_UNAVAILABLE = "the registry's database is unavailable: retry later"


def database_unavailable(exc: DBAPIError) -> bool:
    """A lost or refused database connection (a PostgreSQL restart, SQLite's lock held by
    another process): the registry unavailable, not the request wrong."""
    return bool(exc.connection_invalidated) or isinstance(exc, OperationalError)


log = logging.getLogger("fleetbench.registry")

# The domain's refusals and their status; the answer's detail is the error's message.
REFUSALS: dict[type[Exception], int] = {
    ReportRefused: 422,
    PlanRefused: 422,
    RunConflict: 409,
    PlanChanged: 409,
}


def install_error_answers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(PoolTimeout, _database_busy)
    app.add_exception_handler(DBAPIError, _database_error)
    for refusal in REFUSALS:
        app.add_exception_handler(refusal, _refused)


async def _refused(_request: Request, exc: Exception) -> JSONResponse:
    [status] = [code for kind, code in REFUSALS.items() if isinstance(exc, kind)]
    return JSONResponse(status_code=status, content={"detail": str(exc)})


async def _database_busy(request: Request, exc: Exception) -> JSONResponse:
    log.warning("no database connection free in time: %s", exc)
    return _unavailable(request, "the registry's database is busy: retry later")


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DBAPIError)
    if not database_unavailable(exc):
        raise exc
    log.warning("database unavailable: %s", exc.orig)
    return _unavailable(request, DATABASE_UNAVAILABLE)


def _unavailable(request: Request, detail: str) -> JSONResponse:
    settings: RegistrySettings = request.app.state.settings
    return JSONResponse(
        {"detail": detail}, status_code=503, headers={"Retry-After": str(settings.retry_after_s)}
    )


async def _invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [_printable(error) for error in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": jsonable_encoder(errors)})


def _printable(error: Any) -> dict[str, Any]:
    """FastAPI's default handler echoes the offending input, which fails for NaN or
    infinity (not JSON) or a lone surrogate (not UTF-8), and can be the whole report: keep
    scalars only, as text if need be."""
    printable = {k: _text(v) for k, v in error.items() if k not in ("input", "ctx", "url")}
    value = error.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        printable["input"] = str(value)
    elif isinstance(value, str):
        printable["input"] = _text(value)
    elif isinstance(value, int | float | bool) or value is None:
        printable["input"] = value
    if "ctx" in error:
        printable["ctx"] = {k: _text(str(v)) for k, v in error["ctx"].items()}
    return printable


def _text(value: Any) -> Any:
    """`value`, with what UTF-8 cannot carry (lone surrogates) written as escapes."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [_text(item) for item in value]
    return value
