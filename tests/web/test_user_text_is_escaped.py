"""Names and labels come from nodes: every page shows them as text, never as markup."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from fleetbench.contract import wire
from tests.factories import ARTICLE_TABLE
from tests.web.conftest import TIMES, Dashboard, Fleet, hours_ago

NODE = "<img src=x onerror=window.__xss=1>"
MODEL = "<b>bold</b><script>window.__xss=2</script>"
LABEL = '"><svg onload=window.__xss=3>'
ENGINE = "<u>llama</u>"

# Elements the payloads would create if they were parsed as HTML.
INJECTED = "document.querySelectorAll('main img, main script, main b, main u, [onerror], [onload]')"


def assert_inert(dashboard: Dashboard) -> None:
    page = dashboard.page
    assert page.evaluate(f"{INJECTED}.length") == 0
    assert page.evaluate("window.__xss") is None


def test_user_text_shows_as_text_everywhere(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.node(NODE, note=LABEL)
    # Four runs on one build, then two 15% slower on the next: a regression to show.
    for day, factor in enumerate([1.0, 1.01, 0.99, 1.0, 0.85, 0.85]):
        fleet.report(
            NODE,
            model=MODEL,
            table=[(b, s_pp, s_tg * factor) for b, s_pp, s_tg in ARTICLE_TABLE],
            started_at=hours_ago(24 * (10 - day)),
            engine=wire.EngineBuild(engine=ENGINE, build_number=11429 + (day >= 4)),
        )
    engine = f"{ENGINE} b11430"

    page = dashboard.open("/")
    assert dashboard.table("#nodes")[0][:4] == [NODE, "regressed", "—", engine]
    assert dashboard.table("#nodes")[0][9] == f"note={LABEL}"
    assert_inert(dashboard)
    page.fill("#filter", "<img")
    assert len(dashboard.table("#nodes")) == 1

    page.click("#nodes tbody a")
    dashboard.wait()
    assert page.text_content("h1") == NODE
    assert dashboard.table("#models")[0][0] == MODEL
    assert_inert(dashboard)

    page.click("#models tbody a")
    dashboard.wait()
    assert page.text_content("h1") == f"{NODE} {TIMES} {MODEL}"
    legend = page.eval_on_selector_all(
        "#decode-chart .legendtext", "ts => ts.map(t => t.textContent)"
    )
    assert f"{engine}: total" in legend
    assert dashboard.table("#points")[-1][0] == engine
    assert_inert(dashboard)

    page = dashboard.open(f"/placement?model={quote(MODEL)}&min_tps_per_user=15")
    assert dashboard.table("#candidates")[0][1] == NODE
    assert MODEL in (page.text_content("#reason") or "")
    # Plotly shows the escaped name as the literal text too.
    assert page.text_content("#placement-chart .xtick text") == NODE
    assert MODEL in (page.text_content("#placement-chart .gtitle") or "")
    assert_inert(dashboard)
    dashboard.screenshot("escaped-placement")

    page = dashboard.open("/regressions")
    rows = dashboard.table("#regressions")
    assert {(r[1], r[2]) for r in rows} == {(NODE, MODEL)}
    assert ENGINE in rows[0][8]  # the cause names the builds
    assert_inert(dashboard)

    page.click("#regressions tbody tr:first-child a:text-is('timeline')")
    dashboard.wait()
    assert page.text_content("h1") == f"{NODE} {TIMES} {MODEL}"
    assert ENGINE in (page.text_content("#series-chart .annotation-text") or "")
    assert_inert(dashboard)
    dashboard.screenshot("escaped-series")
    dashboard.assert_clean()


def test_names_travel_safely_in_links(dashboard: Dashboard, fleet: Fleet) -> None:
    """Names with &, #, ?, / and spaces survive the round trip through page addresses."""
    node, model = "rack 3/gpu#7?&x=1", "Qwen & co/7B?.gguf#1"
    fleet.report(node, model=model, started_at=hours_ago(3))
    page = dashboard.open("/")
    page.click("#nodes tbody a")
    dashboard.wait()
    assert page.text_content("h1") == node
    page.click("#models tbody a")
    dashboard.wait()
    assert page.text_content("h1") == f"{node} {TIMES} {model}"
    assert dashboard.trace_points("prefill-chart") == {"llama.cpp b11429 Metal": 6}
    dashboard.open(f"/curves?{urlencode({'node': node, 'model': model})}")
    assert dashboard.table("#points")[0][2] == "1"
    dashboard.assert_clean()
