"""Serving runs in the registry: stored beside offline runs without touching what offline
runs decide (a node's last run and health, its latest curve, its history)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest

from fleetbench.agent.client import RegistryClient
from fleetbench.contract import wire
from tests.agent.flaky_registry import flaky_registry
from tests.factories import (
    DAY0,
    WOBBLE,
    LiveRegistry,
    make_report,
    make_serving_report,
    post_report,
)


def _serving(node: str, *, status: str = "ok", **fields: Any) -> wire.RunReport:
    points = [] if status == "failed" else [
        wire.ServingPoint(concurrency=1, requests=4, completed=4, output_tokens=32, seconds=2.0)
    ]  # fmt: skip
    failures = [wire.FailedPoint(pp=32, tg=8, b=2, reason="every request failed: 4 refused")]
    return make_report(
        node=node,
        kind="serving",
        points=[],
        status=status,
        error="the server at http://127.0.0.1:1 did not answer" if status == "failed" else None,
        server=wire.ServerIdentity(kind="llama-server", prompt_tokens=32, gen_tokens=8,
                                   prompt_exact=True),
        serving_points=points,
        failures=failures if status != "ok" else [],
        **fields,
    )  # fmt: skip


def test_a_serving_run_leaves_the_nodes_health_history_and_curve_alone(
    live_registry: LiveRegistry,
) -> None:
    token = live_registry.token("gpu-1")
    offline = make_report(node="gpu-1", started_at=DAY0)
    later = DAY0 + timedelta(hours=1)
    with live_registry.client(token) as client:
        assert post_report(client, offline).status_code == 201
        failed = _serving("gpu-1", status="failed", started_at=later)
        assert post_report(client, failed).status_code == 201
        assert post_report(client, _serving("gpu-1", started_at=later)).status_code == 201
    with live_registry.client() as client:
        node = client.get("/v1/nodes/gpu-1").json()
        history = client.get(
            "/v1/series", params={"node": "gpu-1", "model": offline.model.name, "pp": 512,
                                  "tg": 128, "b": 8},
        ).json()  # fmt: skip
        export = client.get(f"/v1/runs/{failed.run_id}/export")
        runs = client.get("/v1/runs", params={"node": "gpu-1"}).json()
    assert (node["runs"], node["last_status"], node["health"]) == (3, "ok", "stale")
    assert node["last_run_at"].startswith("2026-11-01T06:00")  # the offline run's
    assert [p["run_id"] for p in history["points"]] == [str(offline.run_id)]
    assert export.status_code == 409
    assert sorted(r["kind"] for r in runs["data"]) == ["offline", "serving", "serving"]


def test_curves_put_the_serving_run_beside_the_engines(live_registry: LiveRegistry) -> None:
    token = live_registry.token("gpu-2")
    engine = make_report(node="gpu-2", pp=32, tg=8, table=[(1, 500.0, 50.0), (2, 600.0, 80.0)])
    server = _serving("gpu-2").model_copy(
        update={
            "serving_points": [
                wire.ServingPoint(concurrency=c, requests=4, completed=4, output_tokens=32,
                                  seconds=1.0, total_tps=tps, per_user_tps_p50=tps / c)
                for c, tps in ((1, 40.0), (2, 60.0), (4, 70.0))
            ]
        }
    )  # fmt: skip
    with live_registry.client(token) as client:
        assert post_report(client, engine).status_code == 201
        assert post_report(client, server).status_code == 201
    with live_registry.client() as client:
        answer = client.get("/v1/curves", params={"node": "gpu-2", "model": engine.model.name})
    serving = answer.json()["serving"]
    assert serving["run_id"] == str(server.run_id)
    assert serving["offline_run_id"] == str(engine.run_id)
    assert serving["server"]["kind"] == "llama-server"
    # 40 of the engine's 50 tokens/s at B=1, 60 of 80 at B=2; B=4 was not measured offline
    assert [p["of_offline_pct"] for p in serving["points"]] == [80.0, 75.0, None]
    assert [p["per_user_tps_p50"] for p in serving["points"]] == [40.0, 30.0, 17.5]


def test_a_slower_server_build_is_a_serving_regression_of_its_own_series(
    live_registry: LiveRegistry,
) -> None:
    token = live_registry.token("gpu-3")
    with live_registry.client(token) as client:
        offline = make_report(node="gpu-3", started_at=DAY0 - timedelta(days=1))
        assert post_report(client, offline).status_code == 201
        for day, (build, factor) in enumerate(
            [(7100, w) for w in WOBBLE[:5]] + [(7200, 0.8 * w) for w in WOBBLE[5:7]]
        ):
            served = make_serving_report(
                node="gpu-3",
                model=offline.model.name,
                build_number=build,
                points=[(1, 50.0 * factor, 45.0, 100.0), (4, 160.0 * factor, 35.0, 400.0)],
                started_at=DAY0 + timedelta(days=day),
            )
            assert post_report(client, served).status_code == 201
    with live_registry.client() as client:
        found = client.get("/v1/regressions", params={"node": "gpu-3"}).json()
        series = client.get(
            "/v1/series",
            params={"node": "gpu-3", "model": offline.model.name, "pp": 512, "tg": 128, "b": 4,
                    "metric": "srv_tps"},
        ).json()  # fmt: skip
        node = client.get("/v1/nodes/gpu-3").json()
    # both concurrencies served 20% less after the server's upgrade; the offline series has
    # one run and no step
    assert found["count"] == 2
    four = next(r for r in found["data"] if r["b"] == 4)
    assert (four["metric"], four["pp"], four["tg"]) == ("srv_tps", 512, 128)
    assert four["cause"] == (
        "llama.cpp build changed (llama.cpp b7100 (0c1e570) -> llama.cpp b7200 (0c1e570))"
    )
    assert four["change_pct"] == pytest.approx(-20, abs=1.5)
    assert (four["runs_before"], four["runs_after"]) == (5, 2)
    assert [p["value"] for p in series["points"]] == pytest.approx(
        [160.0 * w for w in WOBBLE[:5]] + [128.0 * w for w in WOBBLE[5:7]]
    )
    assert series["points"][5]["change"].startswith("llama.cpp build changed")
    assert len(series["regressions"]) == 1
    assert node["open_regressions"] == 2


def test_a_searched_serving_run_keeps_what_the_search_found(live_registry: LiveRegistry) -> None:
    searched = make_serving_report(
        node="gpu-4",
        points=[(1, 50.0, 45.0, 100.0), (2, 90.0, 40.0, 150.0), (3, 120.0, 30.0, 900.0)],
        slo_search=wire.SloSearch(
            objective="ttft_p90<=500ms",
            concurrency=2,
            stop_reason="objective failed at concurrency 3: ttft_p90 900.0 ms > 500 ms",
        ),
    )
    with live_registry.client(live_registry.token("gpu-4")) as client:
        assert post_report(client, searched).status_code == 201
    with live_registry.client() as client:
        detail = client.get(f"/v1/runs/{searched.run_id}").json()
    assert detail["slo_search"] == {
        "objective": "ttft_p90<=500ms",
        "concurrency": 2,
        "stop_reason": "objective failed at concurrency 3: ttft_p90 900.0 ms > 500 ms",
    }


def test_a_registry_that_does_not_know_a_field_stores_the_run_and_the_agent_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    searched = make_serving_report(
        node="gpu-5",
        points=[(1, 50.0, 45.0, 100.0)],
        slo_search=wire.SloSearch(objective="ttft_p90<=500ms", concurrency=1, stop_reason="x"),
    )
    with flaky_registry() as older, RegistryClient(older.url, token="t") as client:
        older.ignored_fields = ["slo_search"]  # as a registry that predates searches answers
        with caplog.at_level(logging.WARNING, logger="fleetbench.client"):
            receipt = client.submit_run(searched)
    assert (receipt.run_id, receipt.ignored_fields) == (searched.run_id, ["slo_search"])
    assert older.bodies == [json.loads(searched.model_dump_json())]  # sent once, whole
    assert f"stored run {searched.run_id} without slo_search" in caplog.text
