"""The registry's FastAPI application."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI, HTTPException
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from fleetbench.contract.wire import SCHEMA_VERSION
from fleetbench.registry.admission import Admission, Lane, LaneLimits, UploadLimits
from fleetbench.registry.authentication import Authenticator, EpochWatch, FailedLogins
from fleetbench.registry.body_limit import BodySizeLimit
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.costs import count_statements
from fleetbench.registry.db import create_db_engine, session_factory
from fleetbench.registry.deps import READ_SCHEME, SessionDep
from fleetbench.registry.errors import install_error_answers
from fleetbench.registry.ingest import Ingest, IngestLimits
from fleetbench.registry.metrics import HttpMetricsMiddleware, install_metrics
from fleetbench.registry.notify import WebhookNotifier
from fleetbench.registry.regressions.judge import RegressionJudge
from fleetbench.registry.responses import API_RESPONSES
from fleetbench.registry.routes import (
    compare,
    history,
    models,
    nodes,
    placement,
    plans,
    prices,
    rollouts,
    runs,
    tokens,
)
from fleetbench.registry.state import ProcessState
from fleetbench.registry.web import pages as web_pages
from fleetbench.version import VERSION

__all__ = ["create_app"]

log = logging.getLogger("fleetbench.registry")

DESCRIPTION = f"""
The fleet's batching curves (llama-batched-bench points) and the question they answer:
**which node and concurrency meets X tokens/s per user for model Y?**

Nodes report runs with `POST /v1/runs` (wire format `RunReport`, schema version
{SCHEMA_VERSION}; fields this registry does not know are left out and named in the receipt)
using a token from `fleetbench-registry token create --node NAME`.

A busy registry answers 503 with a `Retry-After` header rather than queueing without bound;
so does one whose database is unreachable. Retrying later is always safe.
"""


def create_app(settings: RegistrySettings | None = None, *, tune_gc: bool = False) -> FastAPI:
    """The registry's app. `tune_gc`: the app owns its process (`fleetbench-registry
    serve`: served_app), whose garbage collector it tunes for serving; an app sharing a
    process (a test's, an embedder's) leaves the collector alone."""
    settings = settings or RegistrySettings()
    engine = create_db_engine(settings.sqlalchemy_url, pool_size=settings.pool_size)
    count_statements(engine)
    sessions = session_factory(engine)
    process = ProcessState()
    notifier = (
        WebhookNotifier(
            sessions,
            url=settings.webhook_url,
            public_url=settings.public_url,
            max_age=timedelta(days=settings.webhook_max_age_days),
            compare_settings=settings.compare_settings(),
        )
        if settings.webhook_url
        else None
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # One worker thread per admitted request and some to spare: an admitted request
        # never waits for a thread (registry.admission).
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        if notifier is not None:
            notifier.start()
        judge.start()
        epoch_watch.start()
        if tune_gc:
            _tune_gc_for_serving()
        yield
        if tune_gc:
            gc.unfreeze()
        ingest.close()
        epoch_watch.stop()
        judge.stop()
        if notifier is not None:
            notifier.stop()
        engine.dispose()

    app = FastAPI(
        title="fleetbench registry",
        version=VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        # the API's docs are the dashboard's page /docs, served from here under its CSP
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.sessions = sessions
    app.state.notifier = notifier
    app.state.process = process
    reads = Lane(
        "read",
        LaneLimits(settings.max_reads_in_flight, settings.max_queued, settings.max_queue_wait_s),
    )
    writes = Lane(
        "write",
        LaneLimits(settings.max_writes_in_flight, settings.max_queued, settings.max_queue_wait_s),
    )
    metrics = install_metrics(app, max_points=settings.metrics_max_points)
    authenticator = Authenticator(
        sessions,
        process.known_tokens,
        FailedLogins(limit=settings.auth_failures_per_minute),
        lane=Lane(
            "token",
            LaneLimits(
                settings.max_token_lookups_in_flight,
                settings.max_queued,
                settings.max_queue_wait_s,
            ),
        ),
        retry_after_s=settings.retry_after_s,
        on_shed=metrics.shed,
    )
    app.state.authenticator = authenticator
    epoch_watch = EpochWatch(sessions, process.known_tokens)
    judge = RegressionJudge(
        sessions,
        delay_s=settings.regression_check_delay_s,
        regressed=notifier.wake if notifier is not None else None,
        measured=metrics.judge_steps,
        outputs_min_kl=settings.compare_outputs_min_kl,
    )
    ingest = Ingest(
        sessions,
        IngestLimits(
            max_points_per_report=settings.max_points_per_report,
            max_series_per_node=settings.max_series_per_node,
            max_rows_per_node=settings.max_rows_per_node,
        ),
        writers=settings.writer_threads,
        linger=settings.writer_linger_ms / 1000,
        stored=judge.queued,
        measured=metrics.ingest_steps,
        known=process.known_rows,
    )
    app.state.ingest = ingest
    install_error_answers(app)
    app.add_middleware(
        Admission,
        reads=reads,
        writes=writes,
        retry_after_s=settings.retry_after_s,
        authenticate=authenticator.principal,
        uploads=UploadLimits(settings.body_timeout_s, settings.max_uploads_per_token),
        on_shed=metrics.shed,
    )
    # outside admission: a declared size over the bound is refused before a token is
    # looked up, and admission's read of a body is counted against the bound
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_report_bytes)
    # outermost: what the middleware inside answers (413, 503) is counted too
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics, router=app.router)

    api = APIRouter(prefix="/v1", responses=API_RESPONSES)
    api.include_router(runs.ingest_router)
    api.include_router(plans.agent_router)
    for module in (
        runs, nodes, models, placement, compare, rollouts, history, tokens, plans, prices
    ):  # fmt: skip
        api.include_router(module.router)
    app.include_router(api)
    app.include_router(web_pages.router)  # the dashboard: /, /placement, ...

    _document_auth(app, settings)

    @app.get("/livez", tags=["health"])
    async def livez() -> dict[str, str]:  # on the event loop: waits for no worker thread
        """The process answers; its database is not asked: what a liveness probe asks, so
        that a database outage does not restart every registry (they answer 503 until it is
        back, and /readyz says so)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: API_RESPONSES[503]})
    @app.get("/healthz", tags=["health"], responses={503: API_RESPONSES[503]})
    def readyz(session: SessionDep) -> dict[str, str]:
        """The process answers and its database does (/healthz is the same question), with
        the registry's version. Why not is in the registry's log only: the error names the
        database's host, port and name."""
        try:
            session.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            log.warning("healthz: database unavailable: %s", exc)
            raise HTTPException(503, detail="the registry's database is unavailable") from exc
        return {"status": "ok", "version": VERSION}

    return app


def served_app(settings: RegistrySettings | None = None) -> FastAPI:
    """The app of a `fleetbench-registry serve` process (uvicorn's factory in each worker)."""
    return create_app(settings, tune_gc=True)


def _tune_gc_for_serving() -> None:
    """What exists at start-up lives as long as the process: keeping it out of the
    collector's full passes spares requests pauses of tens of milliseconds. And a request
    allocates thousands of objects, nearly all freed at once by reference counting:
    collecting every 700 allocations (the default) cost a fifth of the throughput under
    load (bench/load.py); every 100,000 keeps cycles bounded. Process-wide, so only where
    the registry owns the process: in a test's, a full pass cost 0.15 s a registry."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def _document_auth(app: FastAPI, settings: RegistrySettings) -> None:
    """The schema says what the registry does: a token is optional for reads (the routes
    of ReadAccess, whose scheme is ReadBearer) while they are open
    (FLEETBENCH_READ_TOKEN_REQUIRED unset), required for the others."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        if not settings.read_token_required:
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    if {READ_SCHEME: []} in operation.get("security", []):
                        operation["security"] = [*operation["security"], {}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
