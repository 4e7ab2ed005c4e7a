"""Sweep plans in Chromium: the plans page, and each node's plans on the fleet overview."""

from __future__ import annotations

from typing import Any

from tests.web.conftest import Dashboard, Fleet, hours_ago


def _status(fleet: Fleet, node: str, **status: Any) -> None:
    with fleet.registry.client(fleet.node(node)) as client:
        assert client.put("/v1/agent/status", json=status).status_code == 204


def test_plans_and_where_they_run(dashboard: Dashboard, fleet: Fleet) -> None:
    admin = fleet.registry.scoped_token("admin", name="ops")
    body = {"labels": {"pool": "a"}, "model": {"path": "/models/nemo.gguf", "name": "nemo"}}
    with fleet.registry.client(admin) as client:
        for cron in ("0 3 * * *", "30 4 * * *"):
            assert client.put("/v1/plans/nightly", json={**body, "cron": cron}).is_success
        served = {
            "kind": "serving",
            "cron": "15 * * * *",
            "model": {"name": "nemo"},
            "url": "http://127.0.0.1:8080",
            "serve": {"slo": "ttft_p90<=2s", "prompt_tokens": 256},
        }
        assert client.put("/v1/plans/served", json=served).is_success
    fleet.report("gpu-1", started_at=hours_ago(2))
    fleet.report("gpu-2", started_at=hours_ago(2))
    soon = hours_ago(-3).isoformat()
    late = hours_ago(5).isoformat()  # promised 5 h ago, nothing since: missed
    _status(
        fleet,
        "gpu-1",
        plans=[{"name": "nightly", "version": 2, "next_run_at": soon}],
        next_run_at=soon,
    )
    _status(
        fleet,
        "gpu-2",
        plans=[
            {
                "name": "nightly",
                "version": 2,
                "skipped": "model missing: /models/nemo.gguf is not a file on this node",
            }
        ],
        next_run_at=late,
    )

    dashboard.open("/plans")  # reads open, no token: what plans say of the nodes is hidden
    row, serving = dashboard.table("#plans")
    assert row[3] == "nemo (path hidden)"
    assert serving[3] == "nemo (served at a hidden URL)"
    page = dashboard.page
    assert "shown to a reader or admin token" in page.inner_text("#status")
    page.fill("#status input[name=token]", fleet.registry.scoped_token("reader"))
    page.click("#status button[type=submit]")  # kept in the browser; the page reloads
    dashboard.wait()
    row, serving = dashboard.table("#plans")
    assert row[0:2] == ["nightly", "2"]
    assert row[2] == "pool=a"
    assert row[3] == "nemo (/models/nemo.gguf)"
    assert row[4] == "30 4 * * * UTC"
    assert row[5] == "PP 128 · TG 128 · B 1,2,4,8 · repeats until ±1.5%"  # auto: the default
    assert (row[6], row[7]) == ("gpu-1 v2", "gpu-2 v2")
    assert "by ops (token " in row[8]
    assert serving[0:4] == ["served", "1", "every node", "nemo (served at http://127.0.0.1:8080)"]
    assert serving[5] == "serving · largest C meeting ttft_p90<=2000ms · prompt 256 · output 128"

    dashboard.open("/")
    by_node = {r[0]: r for r in dashboard.table("#nodes")}
    assert by_node["gpu-1"][1] == "ok"
    assert by_node["gpu-2"][1] == "missed schedule"
    assert by_node["gpu-1"][7] == "nightly v2"
    assert by_node["gpu-2"][7] == "nightly v2 skipped"
    assert by_node["gpu-1"][8] == "in 3 h"
    assert by_node["gpu-2"][8] == "5 h ago missed"
