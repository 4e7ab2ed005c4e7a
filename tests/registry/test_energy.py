"""What tokens cost in energy, through a live registry on both databases: each point's joules
in the run, its tokens per joule in the curves (with the price of a million tokens beside
it), placement, /metrics and the export; a point whose counter was refused shown with its
reason and no figure; a node that counted nothing showing none; and a build that costs more
energy per token shown by compare, held only where the registry is told to."""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import httpx
import pytest

from fleetbench.contract import wire
from fleetbench.registry.config import RegistrySettings
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    DAY0,
    LiveRegistry,
    agent,
    make_report,
    post_report,
    running_registry,
)
from tests.registry.test_compare import H100, NEW, OLD, compare, gpu

GPU_BOARD = wire.RunEnergy(source="nvml", scope=f"GPU board: 0 ({H100})")
TG = 128
# What the article's table would draw at 60 W: each point's decode of B x 128 tokens at S_TG
WATTS = 60.0


def _joules(b: int, s_tg: float, factor: float = 1.0) -> float:
    return WATTS * b * TG / s_tg * factor


def _with_energy(
    report: wire.RunReport, joules: Mapping[int, float | str], source: wire.RunEnergy = GPU_BOARD
) -> wire.RunReport:
    """The report with each point's energy: its joules, or why the counter gave none."""
    points = []
    for point in report.points:
        given = joules[point.b]
        energy = (
            wire.PointEnergy(invalid=given, seconds=0.4)
            if isinstance(given, str)
            else wire.PointEnergy(joules=given, seconds=given / WATTS, watts_sampled=WATTS)
        )
        points.append(point.model_copy(update={"energy": energy}))
    return report.model_copy(update={"points": points, "energy": source})


def _get(registry: LiveRegistry, path: str, **params: Any) -> Any:
    with httpx.Client(base_url=registry.url) as client:
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json() if "json" in response.headers["content-type"] else response.text


def _post(registry: LiveRegistry, report: wire.RunReport) -> None:
    with registry.client(registry.token(report.node)) as client:
        assert post_report(client, report).status_code == 201


def test_each_point_s_tokens_per_joule_in_the_run_curves_placement_metrics_and_export(
    live_registry: LiveRegistry,
) -> None:
    joules: dict[int, float | str] = {b: _joules(b, s_tg) for b, _, s_tg in ARTICLE_TABLE}
    joules[1] = "0.35 s is too short for a counter read every 0.1 s"
    report = _with_energy(make_report(node="h100", hardware=gpu(H100, "h100")), joules)
    _post(live_registry, report)
    with live_registry.client(live_registry.scoped_token("admin")) as admin:
        priced = admin.put("/v1/prices", json={"hardware_class": H100, "usd_per_hour": 2.0})
        assert priced.status_code == 200, priced.text

    run = _get(live_registry, f"/v1/runs/{report.run_id}")
    assert run["energy"] == {"source": "nvml", "scope": f"GPU board: 0 ({H100})"}
    first, *rest = run["points"]
    assert first["energy"]["invalid"].startswith("0.35 s is too short")
    assert first["energy"]["joules"] is None and first["tokens_per_joule"] is None
    # 60 W at S_TG tokens/s: S_TG / 60 tokens per joule (B = 32: 193.55 / 60 = 3.226)
    by_b = {p["b"]: p["tokens_per_joule"] for p in rest}
    assert by_b == pytest.approx({b: s_tg / WATTS for b, _, s_tg in ARTICLE_TABLE[1:]})
    assert round(by_b[32], 3) == 3.226

    [curve] = _get(live_registry, "/v1/curves", node="h100", model=ARTICLE_MODEL)["curves"]
    assert curve["energy"]["source"] == "nvml" and curve["hardware_class"] == H100
    assert curve["usd_per_hour"] == 2.0
    points = {p["b"]: p for p in curve["points"]}
    assert points[1]["tokens_per_joule"] is None and "too short" in points[1]["energy_invalid"]
    assert points[32]["tokens_per_joule"] == pytest.approx(193.55 / WATTS)
    assert points[32]["joules_per_token"] == pytest.approx(WATTS / 193.55)
    # $2 an hour over S_TG x 3600 tokens, by hand: 19.63 at B = 1, 2.87 at B = 32
    assert round(points[1]["usd_per_million_tokens"], 2) == 19.63
    assert round(points[32]["usd_per_million_tokens"], 2) == 2.87

    placement = _get(live_registry, "/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=10)
    [candidate] = placement["candidates"]
    assert candidate["concurrency"] == 16 and candidate["energy_source"] == "nvml"
    assert candidate["tokens_per_joule"] == pytest.approx(163.18 / WATTS)
    table = agent(
        "placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "10",
        "--registry", live_registry.url,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    [row] = [line for line in table.stdout.splitlines() if line.startswith("│ h100")]
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert (cells[1], cells[9], cells[10]) == ("16", "3.40", "2.72")  # $2/h; 163.18 / 60 W

    metrics = _get(live_registry, "/metrics")
    line = next(
        row
        for row in metrics.splitlines()
        if row.startswith("fleetbench_tokens_per_joule{") and 'b="32"' in row
    )
    assert 'source="nvml"' in line and float(line.split()[-1]) == pytest.approx(193.55 / WATTS)
    assert not any(
        row.startswith("fleetbench_tokens_per_joule{") and 'b="1"' in row
        for row in metrics.splitlines()
    )  # the refused point has no figure, never 0

    exported = _get(live_registry, f"/v1/runs/{report.run_id}/export", format="csv")
    rows = {row["b"]: row for row in csv.DictReader(io.StringIO(exported))}
    assert float(rows["8"]["joules"]) == pytest.approx(_joules(8, 133.65))
    assert float(rows["8"]["tokens_per_joule"]) == pytest.approx(133.65 / WATTS)
    assert rows["8"]["energy_source"] == "nvml"
    assert rows["1"]["joules"] == "" and "too short" in rows["1"]["energy_invalid"]


def test_a_node_that_counted_no_energy_shows_none_and_no_error(
    live_registry: LiveRegistry,
) -> None:
    report = make_report(node="m4pro")
    _post(live_registry, report)
    run = _get(live_registry, f"/v1/runs/{report.run_id}")
    assert run["energy"] is None
    assert all(p["energy"] is None and p["tokens_per_joule"] is None for p in run["points"])
    [curve] = _get(live_registry, "/v1/curves", node="m4pro", model=ARTICLE_MODEL)["curves"]
    assert curve["energy"] is None and curve["usd_per_hour"] is None
    assert all(p["tokens_per_joule"] is None for p in curve["points"])
    assert "fleetbench_tokens_per_joule{" not in _get(live_registry, "/metrics")


def test_points_with_energy_and_no_source_are_refused() -> None:
    report = make_report()
    energy = wire.PointEnergy(joules=5.0, seconds=1.0)
    with pytest.raises(ValueError, match="names no source"):
        wire.RunReport.model_validate(
            report.model_dump() | {"points": [report.points[0].model_dump() | {"energy": energy}]}
        )
    for no_measurement in (0.0, 5e-324):  # 0 would read as free tokens; 5e-324 as infinite
        with pytest.raises(ValueError, match=r"greater than or equal to 0\.001"):
            wire.PointEnergy(joules=no_measurement, seconds=1.0)
    with pytest.raises(ValueError, match="either joules or the reason"):
        wire.PointEnergy(seconds=1.0)


def test_extreme_points_with_energy_are_stored_and_exported(live_registry: LiveRegistry) -> None:
    # B x TG = 4.9e9, beyond a 32-bit integer, and the least joules the wire takes: stored
    # (PostgreSQL multiplies them as floats), compared and exported, never a 500
    points = [
        wire.Point(pp=512, tg=70_000, b=b, s_tg=s_tg) for b, s_tg in ((70_000, 1.0), (1, 9.0))
    ]
    report = make_report(node="h100", hardware=gpu(H100, "h100")).model_copy(
        update={"points": points}
    )
    report = _with_energy(report, {70_000: 1e-3, 1: 1e12})
    _post(live_registry, report)
    run = _get(live_registry, f"/v1/runs/{report.run_id}")
    by_b = {p["b"]: p["tokens_per_joule"] for p in run["points"]}
    assert by_b == {70_000: pytest.approx(4.9e12), 1: pytest.approx(70_000 / 1e12)}
    exported = _get(live_registry, f"/v1/runs/{report.run_id}/export", format="json")
    assert {row["b"]: row["joules"] for row in exported} == {70_000: 1e-3, 1: 1e12}


def _seed_energy(registry: LiveRegistry, costlier: float) -> None:
    """Three H100 nodes, three runs of each build at the same speed (1% noise), the new
    build drawing `costlier` times the old one's energy per token."""
    rng = random.Random(5)
    for node in ("h100-0", "h100-1", "h100-2"):
        for hour, build in enumerate([OLD, NEW] * 3):
            factor = costlier if build == NEW else 1.0
            table = [(b, s_pp, s_tg * (1 + rng.gauss(0, 0.01))) for b, s_pp, s_tg in ARTICLE_TABLE]
            report = make_report(
                node=node,
                table=table,
                build_number=build,
                started_at=DAY0 + timedelta(hours=hour),
                hardware=gpu(H100, node),
            )
            joules: dict[int, float | str] = {
                b: _joules(b, s_tg, factor * (1 + rng.gauss(0, 0.01))) for b, _, s_tg in table
            }
            _post(registry, _with_energy(report, joules))


def test_a_build_that_costs_more_energy_per_token_is_shown_and_goes(
    live_registry: LiveRegistry,
) -> None:
    _seed_energy(live_registry, costlier=1.2)
    answer = compare(live_registry)
    assert answer["verdict"] == "go", answer["reason"]
    [summary] = answer["classes"]
    assert summary["verdict"] == "go"
    assert "energy per token at B=" in summary["efficiency"] and "% more" in summary["efficiency"]
    worse = [p for p in summary["points"] if p["metric"] == "joules_per_token"]
    assert len(worse) == 6 and all(17 < p["worse_pct"] < 23 for p in worse)
    assert not any(p["held"] for p in worse)  # shown, not holding
    speeds = [p for p in summary["points"] if p["metric"] != "joules_per_token"]
    assert not any(p["held"] for p in speeds)


def test_the_same_build_holds_where_the_registry_holds_on_energy(
    registry_settings: RegistrySettings,
) -> None:
    settings = registry_settings.model_copy(update={"compare_hold_on_energy": True})
    with running_registry(settings) as registry:
        _seed_energy(registry, costlier=1.2)
        answer = compare(registry)
        assert answer["verdict"] == "hold"
        assert "energy per token at B=" in answer["reason"] and "more" in answer["reason"]
        [summary] = answer["classes"]
        held = [p for p in summary["points"] if p["held"]]
        assert len(held) == 6 and {p["metric"] for p in held} == {"joules_per_token"}


def test_energy_within_noise_shows_nothing(live_registry: LiveRegistry) -> None:
    _seed_energy(live_registry, costlier=1.0)
    [summary] = compare(live_registry)["classes"]
    assert summary["verdict"] == "go" and summary["efficiency"] is None
