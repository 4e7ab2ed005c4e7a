"""The node x model page in Chromium: decode and prefill curves, one line per build."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from fleetbench.agent.importer import declared_hardware
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
    assert rows[4][:9] == [
        OLD, "512 / 128", "16", "163.18", "10.20", "98.1", "284.82", "—", "past knee"
    ]  # fmt: skip
    # 18.75 steps a second of 7.1 GB and 16 caches of 0.094 GB, of 273 GB/s: 59%
    assert rows[10][:9] == [
        NEW, "512 / 128", "16", "300.00", "18.75", "53.3", "300.00", "59%", "knee"
    ]  # fmt: skip
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
