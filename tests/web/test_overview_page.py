"""The fleet overview at / in Chromium."""

from __future__ import annotations

import json
import time
from typing import Any

from playwright.sync_api import Route

from fleetbench.contract import wire
from fleetbench.registry.config import RegistrySettings
from tests.factories import ARTICLE_MODEL, ARTICLE_MODEL_INFO, ARTICLE_TABLE, running_registry
from tests.registry.test_accelerator import h100_fingerprint_data
from tests.registry.test_allocation import BUFFERS, SETTINGS
from tests.web.conftest import Dashboard, Fleet, apple_m4_pro, hours_ago


def test_overview_lists_every_node_with_its_health(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.report("m4pro", started_at=hours_ago(3), hardware=apple_m4_pro())
    fleet.node("gpu-07", rack="b3")
    fleet.report(
        "gpu-07", started_at=hours_ago(5), status="failed", error="model file missing", points=[]
    )
    fleet.report("old-02", started_at=hours_ago(24 * 60), build_number=11000)
    fleet.node("idle-01")

    page = dashboard.open("/")
    rows = dashboard.table("#nodes")
    # Most pressing first: failing, stale, no runs, ok.
    assert [(r[0], r[1]) for r in rows] == [
        ("gpu-07", "failing"),
        ("old-02", "stale"),
        ("idle-01", "no runs"),
        ("m4pro", "ok"),
    ]
    by_node = {r[0]: r for r in rows}
    assert by_node["m4pro"][2] == "Apple M4 Pro, 24 GiB"
    assert by_node["m4pro"][3] == "llama.cpp b11429 Metal"
    assert by_node["old-02"][3] == "llama.cpp b11000 Metal"
    assert by_node["m4pro"][4] == "3 h ago"
    assert by_node["gpu-07"][4] == "5 h ago failed"
    assert by_node["old-02"][4] == "60 d ago"
    assert by_node["idle-01"][4] == "never"
    assert [by_node[n][5] for n in ("m4pro", "gpu-07", "old-02", "idle-01")] == ["1", "1", "1", "0"]
    assert by_node["gpu-07"][9] == "rack=b3"
    assert page.text_content("#subtitle") == "4 nodes"

    # The health summary filters the table.
    summary = page.eval_on_selector_all(
        "#summary button", "bs => bs.map(b => [b.dataset.health || 'all', b.textContent])"
    )
    assert summary == [
        ["all", "4all nodes"],
        ["failing", "1failing"],
        ["stale", "1stale"],
        ["no runs", "1no runs"],
        ["ok", "1ok"],
    ]
    page.click("#summary button[data-health='stale']")
    assert [r[0] for r in dashboard.table("#nodes")] == ["old-02"]
    page.click("#summary button:not([data-health])")
    page.fill("#filter", "rack=b3")
    assert [r[0] for r in dashboard.table("#nodes")] == ["gpu-07"]
    page.fill("#filter", "")
    # Sorting by a column.
    page.click("th[data-key='name']")
    assert [r[0] for r in dashboard.table("#nodes")] == ["gpu-07", "idle-01", "m4pro", "old-02"]
    page.click("th[data-key='name']")
    assert [r[0] for r in dashboard.table("#nodes")] == ["old-02", "m4pro", "idle-01", "gpu-07"]
    dashboard.screenshot("overview")

    # A node links to its page, which lists the models it ran.
    page.click("#nodes a:text-is('m4pro')")
    dashboard.wait()
    assert page.text_content("h1") == "m4pro"
    models = dashboard.table("#models")
    assert [(r[0], r[1], r[3], r[4]) for r in models] == [
        (ARTICLE_MODEL, "1", "ok", "llama.cpp b11429 Metal")
    ]
    assert page.get_attribute(f"#models a:text-is('{ARTICLE_MODEL}')", "href") == (
        f"/curves?node=m4pro&model={ARTICLE_MODEL}"
    )
    dashboard.screenshot("node")
    dashboard.assert_clean()


def _synthetic_fleet(count: int) -> dict[str, Any]:
    healths = ["ok", "ok", "ok", "stale", "failing", "regressed", "no runs"]
    nodes = []
    for i in range(count):
        health = healths[i % len(healths)]
        ran = health != "no runs"
        nodes.append(
            {
                "name": f"node-{i:04d}",
                "labels": {"rack": f"r{i % 40}", "zone": "eu" if i % 2 else "us"},
                "created_at": "2026-01-01T00:00:00Z",
                "last_run_at": "2026-11-28T12:00:00Z" if ran else None,
                "runs": 10 + i % 7 if ran else 0,
                "hardware": "2x NVIDIA H100 80GB HBM3" if i % 3 else "Apple M4 Pro, 24 GiB",
                "engine": f"llama.cpp b{11000 + i % 5} CUDA" if ran else None,
                "last_status": ("failed" if health == "failing" else "ok") if ran else None,
                "open_regressions": 2 if health == "regressed" else 0,
                "health": health,
            }
        )
    return {"data": nodes, "count": count}


def test_overview_of_a_thousand_nodes_is_one_request_and_fast(dashboard: Dashboard) -> None:
    body = json.dumps(_synthetic_fleet(1000))

    def fulfil(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=body)

    page = dashboard.page
    page.route("**/v1/nodes", fulfil)
    started = time.monotonic()
    dashboard.open("/")
    elapsed = time.monotonic() - started
    assert page.locator("#nodes tbody tr").count() == 1000
    assert dashboard.api_requests == ["/v1/nodes"]  # no per-node requests
    render_ms = int(page.evaluate("document.body.dataset.renderMs"))
    print(f"1000 nodes: drawn {render_ms} ms after navigation, {elapsed:.2f} s in all")
    assert render_ms < 3000, render_ms  # from navigation start to the table drawn
    assert elapsed < 5, elapsed
    assert page.text_content("#shown") == "1000 of 1000 shown"
    # 1000 / 7 per health: 143 regressed (i % 7 == 5 for i < 1000).
    assert page.text_content("#summary button[data-health='regressed'] .count") == "143"
    page.click("#summary button[data-health='regressed']")
    assert page.text_content("#shown") == "143 of 1000 shown"
    rows = dashboard.table("#nodes")
    assert {r[1] for r in rows} == {"regressed"}
    assert rows[0][6] == "2"
    assert page.get_attribute("#nodes tbody tr:not([hidden]) td:nth-child(7) a", "href") == (
        "/regressions?node=node-0005"
    )
    page.click("#summary button:not([data-health])")
    page.fill("#filter", "node-0999")
    assert [r[0] for r in dashboard.table("#nodes")] == ["node-0999"]
    dashboard.screenshot("overview-1000-nodes-filtered")
    dashboard.assert_clean()


def test_overview_explains_an_empty_fleet_and_api_errors(dashboard: Dashboard) -> None:
    page = dashboard.open("/", state="empty")
    assert page.text_content(".message.empty") is not None
    assert "No nodes yet" in (page.text_content(".message.empty") or "")
    assert page.is_hidden("#nodes")

    dashboard.allow_console(r"status of 500")
    page.route(
        "**/v1/nodes",
        lambda route: route.fulfill(
            status=500, content_type="application/json", body='{"detail": "database down"}'
        ),
    )
    dashboard.open("/", state="error")
    assert page.text_content("[role=alert]") == "500 Internal Server Error: database down"
    assert page.is_hidden("#nodes")
    dashboard.assert_clean()


def test_a_registry_that_needs_a_token_asks_for_one(
    dashboard: Dashboard, database_url: str
) -> None:
    settings = RegistrySettings(database_url=database_url, read_token_required=True)
    with running_registry(settings) as registry:
        registry.token("m4pro")
        dashboard.allow_console(r"status of 40[13]")
        page = dashboard.page
        page.goto(registry.url + "/")
        dashboard.wait("error")
        assert "a reader or admin token" in (page.text_content("[role=alert]") or "")
        page.fill("[role=alert] input[name=token]", registry.token("m4pro"))
        page.click("[role=alert] button[type=submit]")
        dashboard.wait("error")  # a node token reports runs; it does not read the fleet
        assert "reader or admin scope" in (page.text_content("[role=alert]") or "")
        page.fill("[role=alert] input[name=token]", registry.scoped_token("reader", "wall"))
        page.click("[role=alert] button[type=submit]")
        dashboard.wait()
        assert [r[0] for r in dashboard.table("#nodes")] == ["m4pro"]
    dashboard.assert_clean()


def test_a_gpu_node_measured_on_its_cpu_stands_out(dashboard: Dashboard, fleet: Fleet) -> None:
    h100 = wire.HardwareFingerprint(hash="h100-" + "0" * 59, data=h100_fingerprint_data())
    fleet.report("h100-1", hardware=h100, engine=wire.EngineBuild(build_number=7100,
                 backend="CPU"), started_at=hours_ago(2))  # fmt: skip
    fleet.report("m4pro", started_at=hours_ago(3), hardware=apple_m4_pro())
    dashboard.open("/")
    rows = {r[0]: r[1] for r in dashboard.table("#nodes")}
    assert rows == {"h100-1": "off accelerator", "m4pro": "ok"}
    page = dashboard.open("/nodes/h100-1")
    facts = page.text_content("#node-facts") or ""
    assert "off accelerator (the engine ran on llama.cpp's CPU backend" in facts
    dashboard.assert_clean()


def test_the_node_page_checks_the_kv_maths_against_what_llama_cpp_allocated(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    fleet.report(
        "m4pro",
        model=ARTICLE_MODEL_INFO,
        settings=SETTINGS,
        buffers=BUFFERS,
        hardware=apple_m4_pro(),
    )
    page = dashboard.open("/nodes/m4pro")
    facts = page.text_content("#node-facts") or ""
    assert "KV-cache maths+4.2% of what llama.cpp allocated in the latest run" in facts
    [row] = dashboard.table("#models")
    assert row[5] == "3072.0 MiB (predicted +4.2%)"
    rules = page.get_attribute("#models td.kv-check", "title")
    assert rules == "llama.cpp b10243+ rules, for b11429"
    dashboard.assert_clean()


def test_a_node_far_below_its_class_stands_out_with_its_figures(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    facts = ARTICLE_MODEL_INFO.model_copy(update={"weight_bytes": 7_100_000_000})
    for node in ("mac-1", "mac-2", "mac-3"):
        fleet.report(node, model=facts, hardware=apple_m4_pro(), started_at=hours_ago(2))
    capped = [(b, s_pp, s_tg / 2) for b, s_pp, s_tg in ARTICLE_TABLE]
    fleet.report(
        "mac-capped", model=facts, hardware=apple_m4_pro(), table=capped, started_at=hours_ago(2)
    )
    dashboard.open("/")
    hardware = {r[0]: r[2] for r in dashboard.table("#nodes")}
    assert hardware["mac-1"] == "Apple M4 Pro, 24 GiB"
    # 28.3 / 2 t/s of 7.19 GB a step: 37% of 273 GB/s, where the class's median is 75%
    assert hardware["mac-capped"] == (
        "Apple M4 Pro, 24 GiB below its class"
        f"below its class: 37% of its memory bandwidth at B = 1 on {ARTICLE_MODEL}, against "
        "75% for the 4 nodes of Apple M4 Pro, 24 GiB"
    )
    page = dashboard.open("/nodes/mac-capped")
    assert "below its class 37% of its memory bandwidth" in (page.text_content("#node-facts") or "")
    dashboard.assert_clean()
