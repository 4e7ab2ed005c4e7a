"""The regressions page and a series' timeline in Chromium."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from tests.factories import ARTICLE_MODEL, ARTICLE_TABLE
from tests.web.conftest import MINUS, Dashboard, Fleet, hours_ago

NOISE = [1.0, 1.012, 0.991, 1.004, 0.85 * 0.996, 0.85 * 1.006]  # four runs, then 15% slower


def upgrade_that_slows_decode(fleet: Fleet) -> None:
    """Four runs on build 11429, then two on build 11500 whose decode is 15% slower."""
    for day, factor in enumerate(NOISE):
        fleet.report(
            "m4pro",
            table=[(b, s_pp, s_tg * factor) for b, s_pp, s_tg in ARTICLE_TABLE],
            started_at=hours_ago(24 * (10 - day)),
            build_number=11429 if day < 4 else 11500,
        )


def test_a_regression_links_to_its_timeline(dashboard: Dashboard, fleet: Fleet) -> None:
    upgrade_that_slows_decode(fleet)
    api = fleet.get("/v1/regressions")
    assert api["count"] >= 1
    decode = [r for r in api["data"] if r["metric"] == "s_tg"]
    assert decode and all(r["cause_kinds"] == ["llama.cpp build"] for r in decode)

    page = dashboard.open("/regressions")
    rows = dashboard.table("#regressions")
    assert len(rows) == api["count"]
    first = api["data"][0]
    assert rows[0][1:4] == [
        "m4pro",
        ARTICLE_MODEL,
        f"PP {first['pp']} · TG {first['tg']} · B {first['b']} · decode",
    ]
    assert rows[0][4].startswith(MINUS)  # slower
    assert rows[0][4].endswith(" %")
    assert rows[0][8].startswith(first["cause"])
    assert rows[0][9] == "open"
    assert page.text_content("#count") == f"{api['count']} regressions, 0 improvements"
    dashboard.screenshot("regressions")

    # Filters go to the API and into the address.
    page.fill("input[name=min_change]", "50")
    page.click("button[type=submit]")
    dashboard.wait("empty")
    assert parse_qs(urlsplit(page.url).query) == {"min_change": ["50"]}
    assert page.text_content(".message.empty") == "Nothing detected for these filters."
    page.fill("input[name=min_change]", "")
    page.fill("input[name=node]", "m4pro")
    page.click("button[type=submit]")
    dashboard.wait()
    assert len(dashboard.table("#regressions")) == api["count"]

    # The timeline of the first one.
    page.click("#regressions tbody tr:first-child a:text-is('timeline')")
    dashboard.wait()
    query = parse_qs(urlsplit(page.url).query)
    assert query == {
        "node": ["m4pro"],
        "model": [ARTICLE_MODEL],
        "pp": [str(first["pp"])],
        "tg": [str(first["tg"])],
        "b": [str(first["b"])],
        "metric": ["s_tg"],
    }
    series = fleet.get("/v1/series", **{k: v[0] for k, v in query.items()})
    assert len(series["points"]) == 6
    changes = [p for p in series["points"] if p["change"]]
    assert len(changes) == 1  # the build changed once
    assert "b11500" in changes[0]["change"]

    points = dashboard.trace_points("series-chart")
    assert points == {"decode tokens/s (S_TG)": 6, "step detected": 1}
    chart = dashboard.chart("series-chart")
    values = chart["data"][0]["y"]
    expected = dict(ARTICLE_TABLE_BY_B)[first["b"]]
    assert values == [expected * factor for factor in NOISE]
    # The build change: one vertical line at that run, labelled with what changed.
    shapes = chart["layout"]["shapes"]
    assert len(shapes) == 1
    assert shapes[0]["x0"] == shapes[0]["x1"] == changes[0]["started_at"]
    # Plotly shows what changed as written (its text is escaped for plotly's markup).
    assert page.text_content("#series-chart .annotation-text") == changes[0]["change"]
    assert chart["data"][1]["x"] == [changes[0]["started_at"]]  # the step begins there
    assert page.locator("#series-chart .shapelayer path").count() == 1
    rows = dashboard.table("#series-points")
    assert len(rows) == 6
    assert [r[5] for r in rows] == ["", "", "", "", changes[0]["change"], ""]
    assert len(dashboard.table("#series-regressions")) == 1
    dashboard.screenshot("series")
    dashboard.assert_clean()


ARTICLE_TABLE_BY_B = [(b, s_tg) for b, _, s_tg in ARTICLE_TABLE]


def test_no_regressions_and_a_bad_series_are_explained(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.report("m4pro", started_at=hours_ago(3))
    page = dashboard.open("/regressions", state="empty")
    assert page.text_content(".message.empty") == (
        "No regressions detected: every series holds steady."
    )
    assert page.is_hidden("#regressions")

    page = dashboard.open("/series", state="idle")
    assert "Name a series" in (page.text_content(".message.info") or "")

    page = dashboard.open(f"/series?node=m4pro&model={ARTICLE_MODEL}&pp=512&tg=128&b=3", "empty")
    assert page.text_content(".message.empty") == "No run has measured this series."

    dashboard.allow_console(r"status of 404")
    page = dashboard.open(f"/series?node=nobody&model={ARTICLE_MODEL}&pp=1&tg=1&b=1", "error")
    assert page.text_content("[role=alert]") == "404 Not Found: node 'nobody' not found"
    dashboard.assert_clean()
