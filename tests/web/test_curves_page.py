"""The node x model page in Chromium: decode and prefill curves, one line per build."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

import pytest

from fleetbench.agent.importer import declared_hardware
from fleetbench.contract import wire
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_MODEL_INFO,
    ARTICLE_TABLE,
    make_serving_report,
    post_report,
)
from tests.web.conftest import TIMES, Dashboard, Fleet, hours_ago

# A newer build that scales further: the gains per added stream stay above a quarter of a
# lone stream's speed up to B=16 (28, 26, 22.5, 12.5 t/s against 7.5), then fade (1.9).
NEW_TABLE = [(1, 300.0, 30.0), (2, 295.0, 58.0), (4, 300.0, 110.0), (8, 305.0, 200.0),
             (16, 300.0, 300.0), (32, 300.0, 330.0)]  # fmt: skip
OLD, NEW = "llama.cpp b11429 Metal", "llama.cpp b11500 Metal"
H100 = "NVIDIA H100 80GB HBM3"
NVML = wire.RunEnergy(source="nvml", scope=f"GPU board: 0 ({H100})")
STUCK = "the counter did not advance over the window"


def energy_points(
    table: Sequence[tuple[int, float, float]], joules: Sequence[float | str]
) -> list[wire.Point]:
    """The table's points at PP 512, TG 128, each with its joules or why it has none."""
    return [
        wire.Point(
            pp=512, tg=128, b=b, n_kv=b * 640, s_pp=s_pp, s_tg=s_tg,
            energy=wire.PointEnergy(joules=j, seconds=3.0) if isinstance(j, float)
            else wire.PointEnergy(invalid=j, seconds=0.4),
        )
        for (b, s_pp, s_tg), j in zip(table, joules, strict=True)
    ]  # fmt: skip


def set_price(fleet: Fleet, hardware_class: str, usd_per_hour: float) -> None:
    with fleet.registry.client(fleet.registry.scoped_token("admin", name="ops")) as admin:
        body = {"hardware_class": hardware_class, "usd_per_hour": usd_per_hour}
        response = admin.put("/v1/prices", json=body)
    assert response.status_code == 200, response.text


def test_curves_show_each_build_with_its_knee(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.report("m4pro", started_at=hours_ago(48))
    # the newer run knows the bytes a step reads and the chip (273 GB/s): MBU per point
    facts = ARTICLE_MODEL_INFO.model_copy(update={"weight_bytes": 7_100_000_000})
    hardware = declared_hardware("Apple M4 Pro")
    fleet.report(
        "m4pro",
        started_at=hours_ago(3),
        table=NEW_TABLE,
        build_number=11500,
        model=facts,
        hardware=hardware,
    )

    # From the fleet to the node to its curves, by the links.
    page = dashboard.open("/")
    page.click("#nodes a:text-is('m4pro')")
    dashboard.wait()
    page.click(f"#models a:text-is('{ARTICLE_MODEL}')")
    dashboard.wait()
    assert page.text_content("h1") == f"m4pro {TIMES} {ARTICLE_MODEL}"
    subtitle = page.text_content("#subtitle") or ""
    assert subtitle.startswith("2 curves")
    assert "less than 25% of a lone user's speed" in subtitle

    api = fleet.get("/v1/curves", node="m4pro", model=ARTICLE_MODEL)
    assert [(c["label"], c["knee"]) for c in api["curves"]] == [(OLD, 8), (NEW, 16)]

    assert dashboard.trace_points("decode-chart") == {
        f"{OLD}: total": 6,
        f"{OLD}: per user": 6,
        f"{OLD}: knee": 1,
        f"{NEW}: total": 6,
        f"{NEW}: per user": 6,
        f"{NEW}: knee": 1,
    }
    traces = {t["name"]: t for t in dashboard.chart("decode-chart")["data"]}
    assert traces[f"{OLD}: total"]["y"] == [s_tg for _, _, s_tg in ARTICLE_TABLE]
    assert traces[f"{OLD}: per user"]["y"] == [s_tg / b for b, _, s_tg in ARTICLE_TABLE]
    assert traces[f"{OLD}: per user"]["yaxis"] == "y2"
    assert (traces[f"{OLD}: knee"]["x"], traces[f"{OLD}: knee"]["y"]) == ([8], [133.65])
    assert (traces[f"{NEW}: knee"]["x"], traces[f"{NEW}: knee"]["y"]) == ([16], [300.0])
    # Past the knee the markers are open.
    assert traces[f"{OLD}: total"]["marker"]["symbol"] == ["circle"] * 4 + ["circle-open"] * 2
    assert traces[f"{NEW}: total"]["marker"]["symbol"] == ["circle"] * 5 + ["circle-open"]
    # The knees are marked on the chart too.
    annotations = dashboard.chart("decode-chart")["layout"]["annotations"]
    assert [a["text"] for a in annotations] == ["knee B=8", "knee B=16"]
    assert page.locator("#decode-chart .scatterlayer .trace").count() == 6

    assert dashboard.trace_points("prefill-chart") == {OLD: 6, NEW: 6}
    prefill = {t["name"]: t["y"] for t in dashboard.chart("prefill-chart")["data"]}
    assert prefill[OLD] == [s_pp for _, s_pp, _ in ARTICLE_TABLE]

    rows = dashboard.table("#points")
    assert len(rows) == 12
    assert rows[4][:11] == [
        OLD, "512 / 128", "16", "163.18", "10.20", "98.1", "284.82", "—", "—", "—", "past knee"
    ]  # fmt: skip
    # 18.75 steps a second of 7.1 GB and 16 caches of 0.094 GB, of 273 GB/s: 59%
    assert rows[10][:11] == [
        NEW, "512 / 128", "16", "300.00", "18.75", "53.3", "300.00", "59%", "—", "—", "knee"
    ]  # fmt: skip
    # Neither run counted energy and the M4 Pro has no price: a line each, no empty plot.
    assert page.is_hidden("#energy-card") and page.is_hidden("#cost-card")
    assert page.text_content("#energy-missing") == (
        "No energy counted: the node has no counter the agent can read."
    )
    assert page.text_content("#cost-missing") == (
        "No price for class Apple M4 Pro: an admin sets one with fleetbench-registry price set."
    )
    assert page.get_attribute("#links a:text-is('Ask placement for this model')", "href") == (
        f"/placement?model={ARTICLE_MODEL}"
    )
    dashboard.screenshot("curves")

    # The same page by path.
    dashboard.open(f"/nodes/m4pro/models/{quote(ARTICLE_MODEL)}")
    assert dashboard.trace_points("prefill-chart") == {OLD: 6, NEW: 6}
    dashboard.assert_clean()


def test_curves_explain_unknown_names_and_missing_runs(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.report("m4pro", started_at=hours_ago(3))
    fleet.report(
        "gpu-07", started_at=hours_ago(3), status="failed", error="out of memory", points=[]
    )
    dashboard.allow_console(r"status of 404")
    page = dashboard.open("/curves?node=m4pro&model=no-such-model", state="error")
    assert page.text_content("[role=alert]") == "404 Not Found: model 'no-such-model' not found"
    assert page.is_hidden("#curves-view")
    page = dashboard.open(f"/curves?node=nobody&model={ARTICLE_MODEL}", state="error")
    assert page.text_content("[role=alert]") == "404 Not Found: node 'nobody' not found"
    page = dashboard.open("/nodes/nobody", state="error")
    assert "404 Not Found: node 'nobody' not found" in (page.text_content("[role=alert]") or "")

    # A node whose only run of the model failed has no curve to draw.
    page = dashboard.open(f"/curves?node=gpu-07&model={ARTICLE_MODEL}", state="empty")
    assert page.text_content(".message.empty") == (
        f"No successful run of {ARTICLE_MODEL} on gpu-07 yet."
    )
    assert page.is_hidden("#curves-view")
    dashboard.assert_clean()


def test_the_server_is_drawn_beside_the_engine_with_its_share(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    fleet.report("m4pro", started_at=hours_ago(3))
    served = make_serving_report(
        node="m4pro",
        model=ARTICLE_MODEL,
        # (C, served t/s, p10 per user, TTFT p90 ms): 80% of the engine's S_TG at 1, 75% at 8
        points=[(1, 0.8 * 28.30, 20.0, 150.0), (8, 0.75 * 133.65, 11.0, 900.0),
                (12, 110.0, 8.0, 2400.0)],
        started_at=hours_ago(2),
    )  # fmt: skip
    with fleet.registry.client(fleet.node("m4pro")) as client:
        assert post_report(client, served).status_code == 201

    dashboard.open(f"/curves?node=m4pro&model={quote(ARTICLE_MODEL)}")
    traces = {t["name"]: t for t in dashboard.chart("decode-chart")["data"]}
    server = "server: llama-server b7100-0c1e570"
    assert traces[f"{server}: total"]["x"] == [1, 8, 12]
    assert traces[f"{server}: total"]["y"] == pytest.approx([22.64, 100.2375, 110.0])
    assert traces[f"{server}: per user p50"]["yaxis"] == "y2"
    assert f"{OLD}: total" in traces  # the engine's curve beside it
    subtitle = dashboard.page.text_content("#serving-subtitle") or ""
    assert subtitle.startswith("llama-server b7100-0c1e570 · 4 slots of 4096 tokens")
    assert f"S_TG at that B in {OLD}'s curve of the same lengths" in subtitle
    rows = dashboard.table("#serving-points")
    assert [r[:3] for r in rows] == [
        ["1", "22.64", "80.0 %"],
        ["8", "100.24", "75.0 %"],
        ["12", "110.00", "—"],  # the engine was not measured at B=12
    ]
    assert [r[4:7] for r in rows][1] == ["11.00", "900", "—"]  # no ITL in this report
    dashboard.assert_clean()

    # A node with a serving run and no offline curve still shows what its server did.
    alone = make_serving_report(node="gpu-9", model=ARTICLE_MODEL, points=[(1, 40.0, 30.0, 90.0)])
    with fleet.registry.client(fleet.node("gpu-9")) as client:
        assert post_report(client, alone).status_code == 201
    page = dashboard.open(f"/curves?node=gpu-9&model={quote(ARTICLE_MODEL)}")
    assert page.is_hidden("#points") and page.is_visible("#serving-points")
    assert "no offline curve of the same prompt and output lengths" in (
        page.text_content("#serving-subtitle") or ""
    )
    assert dashboard.trace_points("decode-chart") == {f"{server}: total": 1,
                                                       f"{server}: per user p50": 1}  # fmt: skip
    dashboard.assert_clean()


def test_energy_and_cost_are_drawn_per_build_where_counted_and_priced(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    # The older build's run counted no energy; the newer one's NVML counter gave each point
    # its joules but B=8's (it did not advance). The class costs $3.60 an hour.
    older = [(1, 900.0, 80.0), (2, 900.0, 150.0), (4, 900.0, 250.0), (8, 900.0, 400.0)]
    newer = [(1, 900.0, 100.0), (2, 900.0, 180.0), (4, 900.0, 250.0), (8, 900.0, 500.0)]
    hardware = declared_hardware(H100)
    fleet.report("h100-1", table=older, hardware=hardware, started_at=hours_ago(48))
    fleet.report(
        "h100-1",
        build_number=11500,
        hardware=hardware,
        energy=NVML,
        points=energy_points(newer, [64.0, 80.0, 128.0, STUCK]),
        started_at=hours_ago(3),
    )
    set_price(fleet, H100, 3.6)

    page = dashboard.open(f"/curves?node=h100-1&model={quote(ARTICLE_MODEL)}")
    # B x TG / joules: 128 / 64, 256 / 80, 512 / 128; none at B=8, so no point there.
    energy = {t["name"]: t for t in dashboard.chart("energy-chart")["data"]}
    assert list(energy) == [NEW]
    assert (energy[NEW]["x"], energy[NEW]["y"]) == ([1, 2, 4], [2.0, 3.2, 4.0])
    note = page.text_content("#energy-note") or ""
    assert note.startswith(
        f"What it counts: GPU board: 0 ({H100}), read from nvml; nothing else: not the rest of "
        "the node, its cooling or the facility."
    )
    assert f"No energy counted in {OLD}." in note
    assert "1 point(s) without a figure" in note
    # $3.60 / (S_TG x 3600 s) x 10^6 = 1000 / S_TG dollars a million tokens, each build.
    cost = {t["name"]: t for t in dashboard.chart("cost-chart")["data"]}
    assert cost[OLD]["y"] == pytest.approx([12.5, 1000 / 150, 4.0, 2.5])
    assert cost[NEW]["y"] == pytest.approx([10.0, 1000 / 180, 4.0, 2.0])
    assert cost[NEW]["x"] == [1, 2, 4, 8]
    assert page.text_content("#cost-note") == (
        f"At $3.60 an hour for {H100} (the class's price, GET /v1/prices)."
    )
    assert page.is_hidden("#energy-missing") and page.is_hidden("#cost-missing")

    api = fleet.get("/v1/curves", node="h100-1", model=ARTICLE_MODEL)
    assert api["curves"][1]["points"][1]["tokens_per_joule"] == pytest.approx(3.2)
    assert api["curves"][1]["points"][3]["energy_invalid"] == STUCK
    rows = {(r[0], r[2]): r[8:10] for r in dashboard.table("#points")}
    assert rows[(OLD, "2")] == ["—", "6.67"]
    assert rows[(NEW, "2")] == ["3.20", "5.56"]
    assert rows[(NEW, "8")] == ["no figure", "2.00"]
    why = page.get_attribute(
        "#points tr[data-b='8'][data-build*='b11500'] td:nth-child(9) span", "title"
    )
    assert why == STUCK
    dashboard.screenshot("curves-energy-cost")
    dashboard.assert_clean()


def test_a_counter_that_gave_nothing_and_a_run_without_hardware_say_so(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    # A counter that never advanced, on a node that reported no hardware: no class to price.
    fleet.report(
        "box",
        energy=NVML,
        points=energy_points(ARTICLE_TABLE, [STUCK] * len(ARTICLE_TABLE)),
        started_at=hours_ago(3),
    )
    page = dashboard.open(f"/curves?node=box&model={quote(ARTICLE_MODEL)}")
    assert page.is_hidden("#energy-card") and page.is_hidden("#cost-card")
    assert page.text_content("#energy-missing") == (
        f"No energy figure: the counter (nvml) gave none for any point: {STUCK}."
    )
    assert page.text_content("#cost-missing") == (
        "No price: the runs report no hardware to name a class by, and prices are per class."
    )
    assert [r[8:10] for r in dashboard.table("#points")] == [["no figure", "—"]] * 6
    dashboard.assert_clean()
