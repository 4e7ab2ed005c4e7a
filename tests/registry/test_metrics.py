"""GET /metrics: HTTP and ingest counters, the fleet's gauges, and the Grafana dashboard that
charts them, scraped from a real registry and parsed with prometheus_client's parser."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from fleetbench.contract import wire
from fleetbench.registry import crud, tokens
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import create_db_engine, session_factory
from fleetbench.registry.metrics import FleetCollector, RegistryMetrics
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    LiveRegistry,
    make_report,
    post_report,
    running_registry,
    store_report,
)

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "fleetbench-dashboard.json"
DECODE = "fleetbench_decode_tokens_per_second"
PER_USER = "fleetbench_per_user_tokens_per_second"
PREFILL = "fleetbench_prefill_tokens_per_second"
STARTED = datetime(2026, 10, 16, 12, 0, tzinfo=UTC)


def parse(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(client: httpx.Client) -> list[Sample]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(response.text)


def series(samples: list[Sample], name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The samples called `name`, keyed by the values of `labels` (which must be all of
    their labels, so that no two samples share a key)."""
    found: dict[tuple[str, ...], float] = {}
    for sample in samples:
        if sample.name == name:
            assert set(sample.labels) == set(labels), sample
            key = tuple(sample.labels[label] for label in labels)
            assert key not in found, f"duplicate sample {name}{sample.labels}"
            found[key] = sample.value
    return found


def point_gauges(samples: list[Sample], name: str) -> dict[tuple[str, ...], float]:
    return series(samples, name, "node", "model", "pp", "tg", "b")


def ingest(samples: list[Sample]) -> dict[tuple[str, ...], float]:
    return series(samples, "fleetbench_ingest_runs_total", "outcome", "status")


def key(b: int, node: str = "m4pro", model: str = ARTICLE_MODEL) -> tuple[str, ...]:
    return (node, model, "512", "128", str(b))


def test_fleet_gauges_follow_each_nodes_latest_successful_run(
    live_registry: LiveRegistry,
) -> None:
    m4pro = live_registry.token("m4pro")
    gpu = live_registry.token("gpu-07")
    with live_registry.client(m4pro) as client:
        assert post_report(client, make_report(started_at=STARTED)).status_code == 201
        samples = scrape(client)

    assert point_gauges(samples, DECODE) == {key(b): s_tg for b, _, s_tg in ARTICLE_TABLE}
    per_user = point_gauges(samples, PER_USER)
    assert per_user[key(8)] == 16.70625
    assert per_user[key(32)] == pytest.approx(193.55 / 32)
    assert len(per_user) == 6
    assert point_gauges(samples, PREFILL)[key(8)] == 285.83
    latest = ("m4pro", ARTICLE_MODEL)
    assert series(samples, "fleetbench_latest_run_timestamp_seconds", "node", "model") == {
        latest: STARTED.timestamp()
    }
    assert series(samples, "fleetbench_latest_run_build_number", "node", "model") == {latest: 11429}
    assert series(samples, "fleetbench_fleet_collect_success") == {(): 1}

    later = make_report(
        started_at=STARTED + timedelta(days=1),
        table=[(1, 300.0, 30.5), (8, 290.0, 140.0)],
        build_number=11500,
    )
    failed_last = make_report(
        started_at=STARTED + timedelta(days=2), status="failed", error="model missing", points=[]
    )
    older = make_report(started_at=STARTED - timedelta(days=3), table=[(8, 1.0, 2.0)])
    other = make_report(node="gpu-07", model="Llama-3.1-8B-Q4_K_M", table=[(4, 900.0, 240.0)])
    with live_registry.client(m4pro) as client:
        for report in (later, failed_last, older):
            assert post_report(client, report).status_code == 201
    with live_registry.client(gpu) as client:
        assert post_report(client, other).status_code == 201
        samples = scrape(client)

    gpu_key = key(4, "gpu-07", "Llama-3.1-8B-Q4_K_M")
    # the later run replaced the whole curve (B=2, 4, 16, 32 are gone); the failed and the
    # older runs changed nothing
    assert point_gauges(samples, DECODE) == {key(1): 30.5, key(8): 140.0, gpu_key: 240.0}
    assert point_gauges(samples, PER_USER) == {key(1): 30.5, key(8): 17.5, gpu_key: 60.0}
    assert point_gauges(samples, PREFILL) == {key(1): 300.0, key(8): 290.0, gpu_key: 900.0}
    assert series(samples, "fleetbench_latest_run_build_number", "node", "model") == {
        latest: 11500,
        ("gpu-07", "Llama-3.1-8B-Q4_K_M"): 11429,
    }
    assert (
        series(samples, "fleetbench_latest_run_timestamp_seconds", "node", "model")[latest]
        == (STARTED + timedelta(days=1)).timestamp()
    )


def test_ingest_counters_count_every_report_once(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    other_node = live_registry.token("gpu-07")
    first = make_report(
        status="partial",
        failures=[wire.FailedPoint(pp=512, tg=128, b=64, reason="failed to find a memory slot")],
    )
    second = make_report(started_at=STARTED + timedelta(hours=1))
    with live_registry.client(token) as client:
        before = scrape(client)
        assert post_report(client, first).status_code == 201
        assert post_report(client, second).status_code == 201
        assert post_report(client, first).status_code == 200  # a retry
        edited = first.model_copy(update={"error": "edited"})
        assert post_report(client, edited).status_code == 409
        assert post_report(client, {"schema_version": 1}).status_code == 422
    with live_registry.client() as anonymous:
        assert post_report(anonymous, second).status_code == 401
    with live_registry.client(other_node) as client:
        assert post_report(client, second).status_code == 403
        after = scrape(client)

    assert ingest(before) == {("created", "201"): 0, ("already_stored", "200"): 0}
    assert ingest(after) == {
        ("created", "201"): 2,
        ("already_stored", "200"): 1,
        ("rejected", "409"): 1,
        ("rejected", "422"): 1,
        ("rejected", "401"): 1,
        ("rejected", "403"): 1,
    }
    points = series(after, "fleetbench_ingest_points_total", "kind")
    assert points == {("measured",): 12, ("failed",): 1}
    stored = series(after, "fleetbench_ingest_duration_seconds_count", "outcome")
    assert stored == {("created",): 2, ("already_stored",): 1}
    seconds = series(after, "fleetbench_ingest_duration_seconds_sum", "outcome")
    assert 0 < seconds[("created",)] < 30
    assert live_registry.count("runs") == 2


def test_each_step_of_ingest_and_of_the_judge_says_what_it_cost(
    live_registry: LiveRegistry,
) -> None:
    """What a report costs, step by step: the CPU of the thread, the statements it sent
    (one of each for the whole batch: the points go in one statement) and the rows."""
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        assert post_report(client, make_report()).status_code == 201  # judged on return
        # The judge says what a batch cost just after its commit, which the client's wait
        # for the judgement may see first.
        deadline = time.monotonic() + 10
        # (a pass that found no check due yet says what its claim cost, and nothing more)
        judged = ("series",)
        while judged not in series(
            samples := scrape(client), "fleetbench_judge_step_rows_total", "step"
        ):
            assert time.monotonic() < deadline, "the judge's costs never showed in /metrics"
            time.sleep(0.05)

    def step(work: str, figure: str) -> dict[str, float]:
        found = series(samples, f"fleetbench_{work}_step_{figure}_total", "step")
        return {name: value for (name,), value in found.items()}

    ingest_rows, ingest_statements = step("ingest", "rows"), step("ingest", "statements")
    assert list(ingest_rows) == [
        "digest",
        "lookup",
        "fingerprints",
        "runs",
        "activity",
        "latest",
        "latest_serving",
        "sums",
        "queue",
        "commit",
    ]
    # the run and its 6 points; the latest run and its 6 points; one check queued
    assert (ingest_rows["runs"], ingest_rows["latest"], ingest_rows["queue"]) == (7, 7, 1)
    # PostgreSQL: the run ids taken, the run, its points; the latest run, its old points
    # out, the new in. SQLite runs each row of an executemany as a statement.
    per_point = 1 if live_registry.engine.dialect.name == "postgresql" else 6
    assert ingest_statements["runs"] == 2 + per_point
    assert ingest_statements["latest"] == 2 + per_point
    assert 0 < sum(step("ingest", "cpu_seconds").values()) < 5
    judge_rows = step("judge", "rows")
    assert judge_rows["series"] == 12  # one run's S_TG and S_PP at 6 concurrencies
    assert judge_rows["judge"] == 1  # one check
    assert step("judge", "cpu_seconds")["judge"] > 0


def test_rejected_oversized_report_is_counted(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, max_report_bytes=2048)
    with running_registry(settings) as registry, registry.client(registry.token("m4pro")) as c:
        big = make_report(error="x" * 4000)
        assert post_report(c, big).status_code == 413
        samples = scrape(c)
    assert ingest(samples)[("rejected", "413")] == 1
    requests = series(samples, "fleetbench_http_requests_total", "method", "route", "status")
    assert requests[("POST", "/v1/runs", "413")] == 1


def test_request_metrics_use_the_route_template(live_registry: LiveRegistry) -> None:
    report = make_report()
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, report).status_code == 201
        assert client.get(f"/v1/runs/{report.run_id}").status_code == 200
        assert client.get(f"/v1/runs/{report.run_id}").status_code == 200
        assert client.get(f"/v1/runs/{uuid.uuid4()}").status_code == 404
        assert client.get("/v1/nope/12345").status_code == 404
        assert client.delete("/v1/runs").status_code == 405
        scrape(client)
    with live_registry.client() as anonymous:  # /metrics is open by default
        samples = scrape(anonymous)

    requests = series(samples, "fleetbench_http_requests_total", "method", "route", "status")
    assert requests[("GET", "/v1/runs/{run_id}", "200")] == 2
    assert requests[("GET", "/v1/runs/{run_id}", "404")] == 1
    assert requests[("GET", "unmatched", "404")] == 1
    assert requests[("DELETE", "/v1/runs", "405")] == 1
    assert requests[("POST", "/v1/runs", "201")] == 1
    assert requests[("GET", "/metrics", "200")] == 1  # the first scrape; this one is not done
    labels = {value for sample in samples for value in sample.labels.values()}
    assert not any(str(report.run_id) in value or "nope" in value for value in labels)

    counts = series(
        samples, "fleetbench_http_request_duration_seconds_count", "method", "route", "status"
    )
    assert counts == requests
    buckets = [
        s
        for s in samples
        if s.name == "fleetbench_http_request_duration_seconds_bucket"
        and s.labels["route"] == "/v1/runs/{run_id}"
        and s.labels["status"] == "200"
    ]
    assert [b.value for b in buckets if b.labels["le"] == "+Inf"] == [2]
    assert all(b.value <= 2 for b in buckets)


def test_metrics_need_a_token_only_when_reads_are_closed(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, read_token_required=True)
    with running_registry(settings) as registry:
        token = registry.token("m4pro")
        with registry.client() as anonymous:
            assert anonymous.get("/metrics").status_code == 401
        with registry.client("fbn_not-a-token") as stranger:
            assert stranger.get("/metrics").status_code == 401
        with registry.client(token) as client:
            assert post_report(client, make_report()).status_code == 201
            assert client.get("/metrics").status_code == 403  # a node token reports, no more
        with registry.client(registry.scoped_token("reader", "prometheus")) as client:
            samples = scrape(client)
    assert point_gauges(samples, DECODE)[key(8)] == 133.65
    requests = series(samples, "fleetbench_http_requests_total", "method", "route", "status")
    assert requests[("GET", "/metrics", "401")] == 2


def test_each_app_keeps_its_own_counters(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url)
    with running_registry(settings) as one, running_registry(settings) as two:
        with one.client(one.token("m4pro")) as client:
            assert post_report(client, make_report()).status_code == 201
            first = scrape(client)
        with two.client() as client:
            second = scrape(client)
    assert ingest(first)[("created", "201")] == 1
    assert ingest(second)[("created", "201")] == 0
    # the fleet gauges come from the shared database
    assert point_gauges(second, DECODE)[key(8)] == 133.65


def test_fleet_gauges_are_one_query(engine: Engine, session: Session) -> None:
    for n in range(3):
        node_name = f"node-{n}"
        tokens.create_node_token(session, node_name=node_name, labels={})
        node = crud.find_node(session, node_name)
        assert node is not None
        for model in ("model-a", "model-b"):
            for day in range(2):  # the later run of each holds B=1 at 10 + n
                table = [(1, 100.0, 10.0 + n + day - 1), (2, 100.0, 20.0)]
                report = make_report(
                    node=node_name,
                    model=model,
                    table=table,
                    started_at=STARTED + timedelta(days=day),
                )
                store_report(session, report, node.id)
    session.commit()

    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        families = list(FleetCollector(session_factory(engine)).collect())
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len([s for s in statements if not s.startswith("BEGIN")]) == 1, statements
    decode = {
        tuple(s.labels[label] for label in ("node", "model", "b")): s.value
        for family in families
        if family.name == DECODE
        for s in family.samples
    }
    assert decode == {
        (f"node-{n}", model, b): value
        for n in range(3)
        for model in ("model-a", "model-b")
        for b, value in (("1", 10.0 + n), ("2", 20.0))
    }


def test_models_sharing_a_name_give_one_curve_the_latest(engine: Engine, session: Session) -> None:
    tokens.create_node_token(session, node_name="m4pro", labels={})
    node = crud.find_node(session, "m4pro")
    assert node is not None
    for day, digest, table in (
        (1, "b" * 64, [(1, 300.0, 31.0), (8, 290.0, 141.0)]),
        (0, "a" * 64, [(1, 280.0, 28.0), (4, 280.0, 69.0)]),
    ):
        report = make_report(table=table, started_at=STARTED + timedelta(days=day))
        report = report.model_copy(
            update={"model": wire.ModelInfo(name="Foo-Q4_K_M", sha256=digest)}
        )
        store_report(session, report, node.id)
    session.commit()
    assert len(crud.list_models(session)) == 2

    metrics = RegistryMetrics(session_factory(engine))
    samples = parse(metrics.render().decode())
    decode = point_gauges(samples, DECODE)  # fails on a duplicate sample
    assert decode == {key(1, model="Foo-Q4_K_M"): 31.0, key(8, model="Foo-Q4_K_M"): 141.0}


def test_fleet_gauges_report_a_failed_query(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'no-schema.db'}")
    try:
        metrics = RegistryMetrics(session_factory(engine))
        samples = parse(metrics.render().decode())
    finally:
        engine.dispose()
    assert series(samples, "fleetbench_fleet_collect_success") == {(): 0}
    assert not [s for s in samples if s.name == DECODE]
    assert ingest(samples) == {("created", "201"): 0, ("already_stored", "200"): 0}


def test_grafana_dashboard_charts_metrics_the_registry_exports(
    live_registry: LiveRegistry,
) -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    report = make_report()
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, report).status_code == 201
        assert post_report(client, report).status_code == 200
        samples = scrape(client)
    labels_of: dict[str, set[str]] = {}
    for sample in samples:
        labels_of.setdefault(sample.name, set()).update(sample.labels)

    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 30
    assert dashboard["uid"] == "fleetbench"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "node", "model", "b"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels: list[dict[str, Any]] = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)

    queries: list[str] = [v["query"]["query"] for v in variables.values() if v["type"] == "query"]
    for panel in panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            queries.append(target["expr"])

    referenced: set[str] = set()
    for query in queries:
        names = set(re.findall(r"\bfleetbench_[a-z0-9_]+", query))
        assert names, query
        missing = names - set(labels_of)
        assert not missing, f"{query}: not in a /metrics scrape: {missing}"
        referenced |= names
        available = set().union(*(labels_of[name] for name in names))
        for selector in re.findall(r"fleetbench_[a-z0-9_]+\{([^}]*)\}", query):
            used = set(re.findall(r"(\w+)\s*=~?", selector))
            assert used <= available, f"{query}: labels {used - available}"
        for grouping in re.findall(r"by \(([^)]*)\)", query):
            used = {label.strip() for label in grouping.split(",")}
            assert used <= available, f"{query}: labels {used - available}"
        for variable in re.findall(r"\$(\w+)", query):
            assert variable in variables or variable.startswith("__"), query
    assert {
        DECODE,
        PER_USER,
        "fleetbench_ingest_runs_total",
        "fleetbench_http_request_duration_seconds_bucket",
    } <= referenced
