"""The registry's FastAPI application."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from agent.wire import SCHEMA_VERSION
from registry.body_limit import BodySizeLimit
from registry.config import RegistrySettings
from registry.db import create_db_engine, session_factory
from registry.deps import SessionDep
from registry.metrics import install_metrics
from registry.notify import WebhookNotifier
from registry.routes import history, models, nodes, placement, runs
from registry.validation_errors import validation_error_handler
from registry.web import pages as web_pages

__all__ = ["create_app"]

DESCRIPTION = f"""
The fleet's batching curves (llama-batched-bench points) and the question they answer:
**which node and concurrency meets X tokens/s per user for model Y?**

Nodes report runs with `POST /v1/runs` (wire format `RunReport`, schema version
{SCHEMA_VERSION}) using a token from `fleetbench-registry token create --node NAME`.
"""


def create_app(settings: RegistrySettings | None = None) -> FastAPI:
    settings = settings or RegistrySettings()
    engine = create_db_engine(settings.sqlalchemy_url)
    sessions = session_factory(engine)
    notifier = (
        WebhookNotifier(
            sessions,
            url=settings.webhook_url,
            public_url=settings.public_url,
            max_age=timedelta(days=settings.webhook_max_age_days),
        )
        if settings.webhook_url
        else None
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if notifier is not None:
            notifier.start()
        # What exists at start-up lives as long as the process: keeping it out of the
        # collector's full passes spares requests pauses of tens of milliseconds.
        gc.collect()
        gc.freeze()
        yield
        gc.unfreeze()
        if notifier is not None:
            notifier.stop()
        engine.dispose()

    app = FastAPI(
        title="fleetbench registry", version="0.1.0", description=DESCRIPTION, lifespan=lifespan
    )
    app.state.settings = settings
    app.state.sessions = sessions
    app.state.notifier = notifier
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_report_bytes)
    install_metrics(app)  # GET /metrics; its middleware outermost, so 413s count too

    api = APIRouter(prefix="/v1")
    for module in (runs, nodes, models, placement, history):
        api.include_router(module.router)
    app.include_router(api)
    app.include_router(web_pages.router)  # the dashboard: /, /placement, ...

    @app.get("/healthz", tags=["health"], responses={503: {"description": "database down"}})
    def healthz(session: SessionDep) -> dict[str, str]:
        """The process answers and its database does."""
        try:
            session.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            raise HTTPException(503, detail=f"database unavailable: {exc}") from exc
        return {"status": "ok"}

    return app
