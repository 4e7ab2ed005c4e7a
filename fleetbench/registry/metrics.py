"""Prometheus metrics of the registry, served at `GET /metrics` (text format 0.0.4).

Each app has its own `CollectorRegistry` (`app.state.metrics.registry`), so several apps in
one process (the tests) keep separate counts. Three kinds of metrics:

- HTTP, by a pure ASGI middleware: `fleetbench_http_requests_total` and the histogram
  `fleetbench_http_request_duration_seconds`, labelled `method`, `route` (the route's
  template, `/v1/runs/{run_id}`, never the raw path; `unmatched` for paths no route has)
  and `status`;
- ingest: `fleetbench_ingest_runs_total{outcome,status}` (`created` 201, `already_stored`
  200, `rejected` with the refusal's status: 401, 403, 409, 413, 422, ...),
  `fleetbench_ingest_points_total{kind}` (`measured` and `failed` points of created runs)
  and the histogram `fleetbench_ingest_duration_seconds{outcome}` (the handler's time from
  the validated report to the commit). Stored runs are counted by `ingest_run`; refusals by
  the middleware, since most of them (401, 413, 422) happen before the handler runs;
- the fleet, read from the database at scrape time in one query: from each node's latest
  successful (`ok` or `partial`) run of each model, per `node`, `model`, `pp`, `tg`, `b`:
  `fleetbench_decode_tokens_per_second` (S_TG), `fleetbench_per_user_tokens_per_second`
  (S_TG / B), `fleetbench_prefill_tokens_per_second` (S_PP),
  `fleetbench_memory_bandwidth_utilisation` (MBU: contract.bandwidth) and
  `fleetbench_tokens_per_joule` (with its counter's `source`: contract.energy); per `node`,
  `model`:
  `fleetbench_latest_run_timestamp_seconds` (its start),
  `fleetbench_latest_run_build_number` and `fleetbench_kv_prediction_error_percent` (the
  KV-cache maths against what llama.cpp allocated); and `fleetbench_fleet_collect_success`
  (0 when the query failed) with `fleetbench_fleet_collect_duration_seconds`.

`/metrics` is open like the other reads: it needs a reader or admin token only when
`FLEETBENCH_READ_TOKEN_REQUIRED` is true.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated

import fastapi.routing
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.routing import BaseRoute, Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetbench.contract import wire
from fleetbench.contract.allocation import kv_prediction_error_pct
from fleetbench.contract.energy import tokens_per_joule
from fleetbench.registry.costs import Steps
from fleetbench.registry.deps import ReadAccess
from fleetbench.registry.projections.latest import latest_points_statement
from fleetbench.registry.responses import API_RESPONSES

__all__ = [
    "INGEST_ROUTE",
    "MULTIPROCESS_DIR",
    "FleetCollector",
    "HttpMetricsMiddleware",
    "MetricsDep",
    "RegistryMetrics",
    "flat_routes",
    "install_metrics",
    "route_template",
    "router",
]

log = logging.getLogger(__name__)

INGEST_ROUTE = ("POST", "/v1/runs")
UNMATCHED = "unmatched"
# What generate_latest writes (names escaped to underscores); every Prometheus reads it.
# (newer prometheus-client's CONTENT_TYPE_LATEST says version=1.0.0 for the same bytes.)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_POINT_LABELS = ("node", "model", "pp", "tg", "b")
_RUN_LABELS = ("node", "model")
# Set (to an empty folder) by `serve --workers N`: each worker writes its counters there and
# any of them answers a scrape with the sum (prometheus-client's multiprocess mode).
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


class FleetCollector(Collector):
    """The fleet's latest curves as gauges, computed at each scrape with one query over the
    latest-curve tables; at most `max_points` points, the first by node, model, PP, TG, B
    (fleetbench_fleet_points_truncated says when some were left out)."""

    def __init__(self, sessions: Callable[[], Session], *, max_points: int = 50_000) -> None:
        self._sessions = sessions
        self._max_points = max_points

    def describe(self) -> Iterable[Metric]:
        return self._families()

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "fleetbench_decode_tokens_per_second",
                "S_TG, total decode tokens/s over B sequences, from each node's latest "
                "successful run of each model",
                labels=_POINT_LABELS,
            ),
            GaugeMetricFamily(
                "fleetbench_per_user_tokens_per_second",
                "S_TG / B, decode tokens/s per sequence (user), from each node's latest "
                "successful run of each model",
                labels=_POINT_LABELS,
            ),
            GaugeMetricFamily(
                "fleetbench_prefill_tokens_per_second",
                "S_PP, prompt tokens/s, from each node's latest successful run of each model",
                labels=_POINT_LABELS,
            ),
            GaugeMetricFamily(
                "fleetbench_memory_bandwidth_utilisation",
                "MBU: S_TG / B x the bytes a decode step reads / the node's peak memory "
                "bandwidth (above 1 only against a measured CPU figure), from each node's "
                "latest successful run of each model; points whose model facts or node "
                "bandwidth are unknown have none",
                labels=_POINT_LABELS,
            ),
            GaugeMetricFamily(
                "fleetbench_tokens_per_joule",
                "generated tokens (B x TG) per joule the counted devices drew over the point, "
                "prefill included, from each node's latest successful run of each model; "
                "`source` names the counter (nvml, amdsmi: the GPU board only; rapl: the CPU "
                "packages); points no counter measured validly have none",
                labels=(*_POINT_LABELS, "source"),
            ),
            GaugeMetricFamily(
                "fleetbench_latest_run_timestamp_seconds",
                "start of each node's latest successful run of each model (Unix time)",
                labels=_RUN_LABELS,
            ),
            GaugeMetricFamily(
                "fleetbench_latest_run_build_number",
                "llama.cpp build number of each node's latest successful run of each model",
                labels=_RUN_LABELS,
            ),
            GaugeMetricFamily(
                "fleetbench_kv_prediction_error_percent",
                "how far the KV-cache maths predicted from what llama.cpp allocated in each "
                "node's latest successful run of each model: (predicted - allocated) / "
                "allocated, %; runs that logged no KV buffer have none",
                labels=_RUN_LABELS,
            ),
            GaugeMetricFamily(
                "fleetbench_fleet_collect_success",
                "1 when the fleet gauges were read from the database at this scrape, else 0",
            ),
            GaugeMetricFamily(
                "fleetbench_fleet_points_truncated",
                "1 when the fleet held more points than FLEETBENCH_METRICS_MAX_POINTS and the "
                "gauges list only the first, by node, model, PP, TG and B",
            ),
            GaugeMetricFamily(
                "fleetbench_fleet_collect_duration_seconds",
                "time taken to read the fleet gauges at this scrape",
            ),
        ]

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        decode, per_user, prefill, mbu, efficiency, started, build, kv_error = families[:8]
        success, truncated, duration = families[8:]
        begun = time.perf_counter()
        try:
            with self._sessions() as session:
                rows = (
                    session.connection()
                    .execute(latest_points_statement(), {"limit": self._max_points + 1})
                    .all()
                )
        except SQLAlchemyError:
            log.exception("reading the fleet's latest runs for /metrics failed")
            success.add_metric([], 0)
            duration.add_metric([], time.perf_counter() - begun)
            return [success, duration]
        truncated.add_metric([], 1 if len(rows) > self._max_points else 0)
        rows = rows[: self._max_points]
        # Rows come by node and model, latest run first. Two models may share a display name
        # (different files): the later run wins, so that every label set is emitted once.
        run_of: dict[tuple[str, str], uuid.UUID] = {}
        seen: set[tuple[str, str, str, str, str]] = set()
        for row in rows:
            run_key: tuple[str, str] = (row.node, row.model)
            if run_key not in run_of:
                run_of[run_key] = row.run_id
                started.add_metric(run_key, row.started_at.timestamp())
                if row.build_number is not None:
                    build.add_metric(run_key, row.build_number)
                error = kv_prediction_error_pct(row.kv_predicted_bytes, row.kv_allocated_bytes)
                if error is not None:
                    kv_error.add_metric(run_key, error)
            elif run_of[run_key] != row.run_id:
                continue
            point_key = (row.node, row.model, str(row.pp), str(row.tg), str(row.b))
            if point_key in seen:  # a run holding one point twice: the first stored
                continue
            seen.add(point_key)
            if row.s_tg is not None:
                decode.add_metric(point_key, row.s_tg)
                per_user.add_metric(point_key, row.s_tg / row.b)
            if row.s_pp is not None:
                prefill.add_metric(point_key, row.s_pp)
            if row.mbu is not None:
                mbu.add_metric(point_key, row.mbu)
            per_joule = tokens_per_joule(row.b, row.tg, row.joules)
            if per_joule is not None and row.energy:
                efficiency.add_metric((*point_key, str(row.energy.get("source"))), per_joule)
        success.add_metric([], 1)
        duration.add_metric([], time.perf_counter() - begun)
        return families


class RegistryMetrics:
    """One app's metrics, in a registry of their own."""

    def __init__(self, sessions: Callable[[], Session], *, max_points: int = 50_000) -> None:
        self.registry = CollectorRegistry()
        http_labels = ("method", "route", "status")
        self.http_requests = Counter(
            "fleetbench_http_requests",
            "HTTP requests answered, by method, route template and status code",
            http_labels,
            registry=self.registry,
        )
        self.http_duration = Histogram(
            "fleetbench_http_request_duration_seconds",
            "time from a request's arrival to its answer's last part, by method, route "
            "template and status code",
            http_labels,
            registry=self.registry,
        )
        self.ingest_runs = Counter(
            "fleetbench_ingest_runs",
            "reports sent to POST /v1/runs: created, already_stored (a retry) or rejected, "
            "with the answer's status code",
            ("outcome", "status"),
            registry=self.registry,
        )
        self.ingest_points = Counter(
            "fleetbench_ingest_points",
            "points of created runs: measured or failed",
            ("kind",),
            registry=self.registry,
        )
        self.ingest_duration = Histogram(
            "fleetbench_ingest_duration_seconds",
            "time to store a validated report, to the commit: created or already_stored",
            ("outcome",),
            registry=self.registry,
        )
        for outcome, status in (("created", "201"), ("already_stored", "200")):
            self.ingest_runs.labels(outcome, status)
            self.ingest_duration.labels(outcome)
        for kind in ("measured", "failed"):
            self.ingest_points.labels(kind)
        self.shed_requests = Counter(
            "fleetbench_http_shed",
            "requests answered 503 at once because the registry was busy, by lane (read, "
            "write, token look-up): raise FLEETBENCH_MAX_*_IN_FLIGHT or add workers if this "
            "grows",
            ("lane",),
            registry=self.registry,
        )
        for lane in ("read", "write", "token"):
            self.shed_requests.labels(lane)
        self._step_costs = {
            work: tuple(
                Counter(
                    f"fleetbench_{work}_step_{figure}",
                    f"{what} by each step of {whose}, by step",
                    ("step",),
                    registry=self.registry,
                )
                for figure, what in (
                    ("cpu_seconds", "CPU seconds of the thread"),
                    ("statements", "SQL statements sent"),
                    ("rows", "rows written or read"),
                )
            )
            for work, whose in (
                ("ingest", "the batches of reports stored (registry.ingest)"),
                ("judge", "the regression judge's passes (registry.regressions)"),
            )
        }
        self.fleet = FleetCollector(sessions, max_points=max_points)
        self.registry.register(self.fleet)

    def observe_request(self, *, method: str, route: str, status: int, seconds: float) -> None:
        code = str(status)
        self.http_requests.labels(method, route, code).inc()
        self.http_duration.labels(method, route, code).observe(seconds)
        if (method, route) == INGEST_ROUTE and status >= 400:
            self.ingest_runs.labels("rejected", code).inc()

    def ingested(self, report: wire.RunReport, *, created: bool, seconds: float) -> None:
        """A report stored (`created`) or found already stored, `seconds` after the
        handler got it."""
        outcome = "created" if created else "already_stored"
        self.ingest_runs.labels(outcome, "201" if created else "200").inc()
        self.ingest_duration.labels(outcome).observe(seconds)
        if created:
            self.ingest_points.labels("measured").inc(len(report.points))
            self.ingest_points.labels("failed").inc(len(report.failures))

    def shed(self, lane: str) -> None:
        self.shed_requests.labels(lane).inc()

    def ingest_steps(self, steps: Steps) -> None:
        """What a batch of reports cost, step by step (registry.costs)."""
        self._add_steps("ingest", steps)

    def judge_steps(self, steps: Steps) -> None:
        """What a pass of the regression judge cost, step by step (registry.costs)."""
        self._add_steps("judge", steps)

    def _add_steps(self, work: str, steps: Steps) -> None:
        cpu, statements, rows = self._step_costs[work]
        for step, cost in steps.costs.items():
            cpu.labels(step).inc(cost.cpu_s)
            statements.labels(step).inc(cost.statements)
            rows.labels(step).inc(cost.rows)

    def render(self) -> bytes:
        if not os.environ.get(MULTIPROCESS_DIR):
            return generate_latest(self.registry)
        # Several workers: the counters of all of them, and the fleet once.
        combined = CollectorRegistry()
        MultiProcessCollector(combined)  # type: ignore[no-untyped-call]
        combined.register(self.fleet)
        return generate_latest(combined)


def flat_routes(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """`routes` with included routers expanded, each route with its full path: newer
    FastAPI keeps included routers nested (`iter_route_contexts` flattens them); older
    FastAPI's `app.routes` held copies of the included routes already."""
    expand = getattr(fastapi.routing, "iter_route_contexts", None)
    return list(expand(routes)) if expand is not None else list(routes)


def route_template(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The template (`/v1/runs/{run_id}`) of the route of `routes` (flat, as `flat_routes`
    gives them) that answers `scope` as the router picks it: the first full match, else the
    first partial one (a wrong method, 405); `unmatched` when none does."""
    partial: str | None = None
    for route in routes:
        match, _ = route.matches(scope)
        path = getattr(route, "path_format", None) or getattr(route, "path", None)
        if not isinstance(path, str):
            continue
        if match is Match.FULL:
            return path
        if match is Match.PARTIAL and partial is None:
            partial = path
    return partial or UNMATCHED


class HttpMetricsMiddleware:
    """Pure ASGI middleware counting and timing every HTTP request by method, route
    template and status code (500 when the app raised before answering). A request is
    recorded just before its answer's last part goes out, so a client that has its answer
    finds it counted at its next scrape."""

    def __init__(self, app: ASGIApp, *, metrics: RegistryMetrics, router: Router) -> None:
        self.app = app
        self.metrics = metrics
        self.router = router
        self._routes: list[BaseRoute] | None = None  # flattened at the first request
        # id of the router's pick (routes live as long as the app) -> its full template
        self._templates: dict[int, str | None] = {}

    def _template(self, scope: Scope) -> str:
        """The template of the route that answered: the router leaves its pick in the scope
        (without the prefixes of the routers it was included by), so matching every route
        again, a fifth of a small request's CPU, is needed only when it picked none (404,
        or an answer of the middleware inside: 413, 503)."""
        picked = scope.get("route")
        if picked is not None and (template := self._templates.get(id(picked))) is not None:
            return template
        return route_template(self._routes or [], scope)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"] if scope["method"] in _METHODS else "other"
        if self._routes is None:  # at the first request: every route is included by then
            self._routes = flat_routes(self.router.routes)
            templates: dict[int, str | None] = {}
            for route in self._routes:
                if isinstance(path := getattr(route, "path_format", None), str):
                    key = id(getattr(route, "original_route", route))
                    # A router included twice gives one route two templates: match those.
                    templates[key] = path if templates.get(key, path) == path else None
            self._templates = templates
        status = 500
        recorded = False
        begun = time.perf_counter()

        def record() -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                seconds = time.perf_counter() - begun
                self.metrics.observe_request(
                    method=method, route=self._template(scope), status=status, seconds=seconds
                )

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                record()
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            record()


async def _metrics(request: Request) -> RegistryMetrics:
    metrics: RegistryMetrics = request.app.state.metrics
    return metrics


MetricsDep = Annotated[RegistryMetrics, Depends(_metrics)]

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    dependencies=[ReadAccess],
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
        **API_RESPONSES,
    },
)
def read_metrics(metrics: MetricsDep) -> Response:
    """Prometheus metrics: HTTP, ingest, and the fleet's latest decode speeds. Open unless
    FLEETBENCH_READ_TOKEN_REQUIRED is true (then a reader or admin token, like every GET)."""
    return Response(metrics.render(), media_type=CONTENT_TYPE)


def install_metrics(app: FastAPI, *, max_points: int = 50_000) -> RegistryMetrics:
    """Give `app` its metrics and `GET /metrics`. Call once `app.state.sessions` is set;
    add `HttpMetricsMiddleware` after the other middleware, so that it is outermost and also
    counts what they answer themselves (413, 503)."""
    metrics = RegistryMetrics(app.state.sessions, max_points=max_points)
    app.state.metrics = metrics
    app.include_router(router)
    return metrics
