"""Every figure against the physical limit, through a live registry: MBU per point in the run,
the curves, placement and /metrics; a point that cannot be true kept out; a run measured
under contention kept and shown but out of the answers; nodes far below their class."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from fleetbench.agent.importer import declared_hardware
from fleetbench.contract import wire
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_MODEL_INFO,
    ARTICLE_TABLE,
    DAY0,
    WOBBLE,
    LiveRegistry,
    make_report,
    post_history,
    post_report,
)

# Mistral NeMo 12B Q4_K_M: the weights a step reads whole (all but the token embedding, a
# row of which a step reads), close to what tests/model_headers.py's header gives
NEMO = ARTICLE_MODEL_INFO.model_copy(update={"weight_bytes": 7_100_000_000})
M4_PRO = declared_hardware("Apple M4 Pro")  # 273 GB/s, Apple's figure
STEP_B1 = 7.1e9 + 40 * 8 * 128 * 2 * 2 * (512 + 129 / 2)  # the weights and one KV cache
WHEN = datetime(2026, 10, 16, 12, 0, tzinfo=UTC)


def _report(node: str, **overrides: Any) -> wire.RunReport:
    fields: dict[str, Any] = {"node": node, "model": NEMO, "hardware": M4_PRO}
    return make_report(**(fields | overrides))


def _post(registry: LiveRegistry, *reports: wire.RunReport) -> None:
    with registry.client(registry.token(reports[0].node)) as client:
        for report in reports:
            assert post_report(client, report).status_code in (200, 201)


def _get(registry: LiveRegistry, path: str, **params: Any) -> Any:
    with httpx.Client(base_url=registry.url) as client:
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_each_point_has_its_mbu_in_the_run_curves_placement_and_metrics(
    live_registry: LiveRegistry,
) -> None:
    report = _report("m4pro")
    _post(live_registry, report)

    run = _get(live_registry, f"/v1/runs/{report.run_id}")
    assert run["bandwidth"]["bytes_per_s"] == 273e9 and run["bandwidth"]["source"] == "table"
    mbu = [p["mbu"] for p in run["points"]]
    assert mbu[0] == pytest.approx(28.30 * STEP_B1 / 273e9, rel=1e-6)
    assert 0.7 <= mbu[0] <= 0.85  # the bound for the article's chip
    # Falling with B, the weights read once serving more tokens: 0.75, 0.56, 0.48, 0.48,
    # 0.32, 0.22 (the article's B = 4 row is a little slow for its curve)
    assert [round(x, 2) for x in mbu] == [0.75, 0.56, 0.48, 0.48, 0.32, 0.22]
    assert all(p["impossible"] is None for p in run["points"])

    [curve] = _get(live_registry, "/v1/curves", node="m4pro", model=ARTICLE_MODEL)["curves"]
    assert [p["mbu"] for p in curve["points"]] == pytest.approx(mbu)
    assert curve["bandwidth"]["detail"].startswith("Apple M4 Pro")

    placement = _get(live_registry, "/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=10)
    [candidate] = placement["candidates"]
    assert candidate["concurrency"] == 16
    assert candidate["mbu"] == pytest.approx(mbu[4])

    with httpx.Client(base_url=live_registry.url) as client:
        metrics = client.get("/metrics").text
    line = (
        f'fleetbench_memory_bandwidth_utilisation{{b="1",model="{ARTICLE_MODEL}",'
        'node="m4pro",pp="512",tg="128"}'
    )
    found = next(row for row in metrics.splitlines() if row.startswith(line))
    assert float(found.split()[-1]) == pytest.approx(mbu[0])


def test_a_point_above_the_devices_bandwidth_is_stored_with_its_reason_and_offered_never(
    live_registry: LiveRegistry,
) -> None:
    # 50 t/s at B = 1 would read 360 GB/s of a 273 GB/s chip
    table = [(1, 282.07, 50.0), *ARTICLE_TABLE[1:]]
    report = _report("m4pro", table=table)
    _post(live_registry, report)

    run = _get(live_registry, f"/v1/runs/{report.run_id}")
    first = run["points"][0]
    assert first["mbu"] > 1.05
    assert "cannot be true" in first["impossible"] and "273 GB/s (table)" in first["impossible"]
    assert all(p["impossible"] is None for p in run["points"][1:])

    [curve] = _get(live_registry, "/v1/curves", node="m4pro", model=ARTICLE_MODEL)["curves"]
    assert [p["b"] for p in curve["points"]] == [2, 4, 8, 16, 32]
    placement = _get(live_registry, "/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=30)
    assert placement["candidates"] == []  # 50 t/s per user was never measured


def test_a_run_measured_under_contention_is_shown_but_answers_nothing(
    live_registry: LiveRegistry,
) -> None:
    idle = _report("m4pro", started_at=WHEN)
    halved = [(b, s_pp, s_tg / 2) for b, s_pp, s_tg in ARTICLE_TABLE]
    reason = "other processes used 93% of the CPUs while it ran"
    busy = _report(
        "m4pro",
        table=halved,
        started_at=WHEN + timedelta(days=1),
        contention=wire.Contention(seconds=60, cpu_count=12, other_cpu_share=0.93, reason=reason),
    )
    _post(live_registry, idle, busy)

    shown = _get(live_registry, f"/v1/runs/{busy.run_id}")
    assert shown["contended"] == reason
    assert shown["contention"]["other_cpu_share"] == 0.93
    listed = _get(live_registry, "/v1/runs", node="m4pro")["data"]
    assert {run["id"]: run["contended"] for run in listed} == {
        str(idle.run_id): None,
        str(busy.run_id): reason,
    }

    [curve] = _get(live_registry, "/v1/curves", node="m4pro", model=ARTICLE_MODEL)["curves"]
    assert curve["run_id"] == str(idle.run_id)
    placement = _get(live_registry, "/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=10)
    assert placement["candidates"][0]["run_id"] == str(idle.run_id)
    assert _get(live_registry, "/v1/regressions", node="m4pro")["data"] == []


def test_a_node_far_below_its_class_is_flagged_with_its_figures(
    live_registry: LiveRegistry,
) -> None:
    for node in ("mac-1", "mac-2", "mac-3"):
        _post(live_registry, _report(node))
    slow = [(b, s_pp, s_tg * 0.6) for b, s_pp, s_tg in ARTICLE_TABLE]
    _post(live_registry, _report("mac-capped", table=slow))

    nodes = {n["name"]: n for n in _get(live_registry, "/v1/nodes")["data"]}
    assert [name for name, n in nodes.items() if n["below_class"]] == ["mac-capped"]
    below = nodes["mac-capped"]["below_class"]
    assert below["hardware_class"] == "Apple M4 Pro"
    assert below["model"] == ARTICLE_MODEL
    assert below["class_nodes"] == 4
    assert below["mbu"] == pytest.approx(0.6 * below["class_median"], rel=1e-6)
    detail = _get(live_registry, "/v1/nodes/mac-capped")
    assert detail["below_class"] == below


def test_runs_measured_under_contention_are_no_step_and_no_baseline(
    live_registry: LiveRegistry,
) -> None:
    """Both databases' series reads (PostgreSQL's reads many pairs at once) leave them out."""
    busy = wire.Contention(seconds=60, other_cpu_share=0.9, reason="others used 90% of the CPUs")
    post_history(live_registry, [(11429, w) for w in WOBBLE[:5]])
    # a new build measured twice beside another job, at half the speed: no regression
    post_history(
        live_registry,
        [(11500, 0.5 * w) for w in WOBBLE[5:7]],
        start=DAY0 + timedelta(days=5),
        contention=busy,
    )
    assert _get(live_registry, "/v1/regressions")["count"] == 0
    # measured again on an idle node, 15% slower: the step is found against the history
    # before the build, the contended runs no part of it
    post_history(
        live_registry,
        [(11500, 0.85 * w) for w in WOBBLE[5:7]],
        start=DAY0 + timedelta(days=7),
    )
    found = _get(live_registry, "/v1/regressions")["data"]
    eight = next(r for r in found if (r["metric"], r["b"]) == ("s_tg", 8))
    assert eight["change_pct"] == pytest.approx(-15, abs=1.5)
