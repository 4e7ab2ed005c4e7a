"""Serving runs in the registry: stored beside offline runs without touching what offline
runs decide (a node's last run and health, its latest curve, its history), and offline
reports still written as version 1 wrote them."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from fleetbench.contract import wire
from tests.factories import DAY0, LiveRegistry, make_report, post_report


def _serving(node: str, *, status: str = "ok", **fields: Any) -> wire.RunReport:
    points = [] if status == "failed" else [
        wire.ServingPoint(concurrency=1, requests=4, completed=4, output_tokens=32, seconds=2.0)
    ]  # fmt: skip
    failures = [wire.FailedPoint(pp=32, tg=8, b=2, reason="every request failed: 4 refused")]
    return make_report(
        node=node,
        schema_version=2,
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


def test_offline_reports_are_written_as_version_1_wrote_them() -> None:
    sent = json.loads(make_report().model_dump_json())
    assert not {"kind", "server", "serving_points"} & sent.keys()
    assert wire.RunReport.model_validate(sent).kind == "offline"
    assert "serving_points" in json.loads(_serving("n").model_dump_json())


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
