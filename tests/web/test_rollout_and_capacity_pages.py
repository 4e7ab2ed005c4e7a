"""The rollout (compare) and capacity pages in Chromium: each question as a form or a link,
its answer as the API gives it, drawn; a capacity plan by cost with its prices."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from tests.factories import ARTICLE_MODEL, LiveRegistry
from tests.registry.test_capacity import seed_fleet
from tests.registry.test_capacity_cost import L4, seed_priced_fleet
from tests.registry.test_compare import A100, FLEET, H100, NEW, OLD, h100_slower_at_8_and_up, seed
from tests.web.conftest import Dashboard, Fleet


def test_the_compare_page_shows_the_verdict_each_class_and_each_nodes_ratio_per_b(
    dashboard: Dashboard, fleet: Fleet, live_registry: LiveRegistry
) -> None:
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 3}, h100_slower_at_8_and_up)
    page = dashboard.open("/compare", state="idle")
    page.fill("input[name=model]", ARTICLE_MODEL)
    page.fill("input[name=from_build]", f"b{OLD}")
    page.fill("input[name=to_build]", f"b{NEW}")
    page.click("button[type=submit]")
    dashboard.wait()
    api = fleet.get("/v1/compare", model=ARTICLE_MODEL, from_build=f"b{OLD}", to_build=f"b{NEW}")
    assert page.text_content("#verdict") == "hold"
    assert page.text_content("#reason") == api["reason"]
    classes = dashboard.table("#classes")
    assert [row[:3] for row in classes] == [[A100, "go", "3"], [H100, "hold", "3"]]
    rows = dashboard.table("#points")
    assert len(rows) == 6 * 2 * 6  # nodes x metrics x B
    h100_at_16 = next(r for r in rows if r[:2] == ["h100-0", "S_TG"] and r[3] == "16")
    assert h100_at_16[6].endswith(" worse")
    # each node's S_TG ratio per B, one line per node, around 0.88 for the H100s past B=8
    chart = dashboard.chart("compare-chart")
    lines = {trace["name"]: trace for trace in chart["data"]}
    assert set(lines) == set(FLEET)
    assert lines["h100-1"]["x"] == [1, 2, 4, 8, 16, 32]
    assert all(0.83 < y < 0.93 for y in lines["h100-1"]["y"][3:])
    assert all(0.95 < y < 1.05 for y in lines["a100-1"]["y"])
    # the question is in the address: a link reopens the answer
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"model": [ARTICLE_MODEL], "from_build": [f"b{OLD}"], "to_build": [f"b{NEW}"]}
    dashboard.open(page.url.removeprefix(dashboard.url))
    assert page.text_content("#verdict") == "hold"


def test_the_capacity_page_plans_with_reserved_nodes_and_lists_who_was_left_out(
    dashboard: Dashboard, fleet: Fleet, live_registry: LiveRegistry
) -> None:
    seed_fleet(live_registry)
    page = dashboard.open("/capacity", state="idle")
    page.fill("input[name=model]", ARTICLE_MODEL)
    page.fill("input[name=users]", "40")
    page.fill("input[name=min_tps_per_user]", "10")
    page.fill("input[name=reserve]", "h100-b, nobody")
    page.click("button[type=submit]")
    dashboard.wait()
    api = fleet.get(
        "/v1/capacity",
        model=ARTICLE_MODEL,
        users=40,
        min_tps_per_user=10,
        reserve=["h100-b", "nobody"],
    )
    assert page.text_content("#reason") == api["reason"]
    plan = dashboard.table("#plan")
    assert [row[:3] for row in plan] == [["h100-a", H100, "32"], ["a100-a", A100, "16"]]
    assert dashboard.table("#classes") == [  # no class priced
        [A100, "not enough", "4", "34", "—", "—"],
        [H100, "not enough", "2", "36", "—", "—"],
    ]
    left_out = dict(dashboard.table("#refused"))
    assert left_out["h100-b"] == "reserved" and left_out["m4-knee"].startswith("B=16")
    chart = dashboard.chart("capacity-chart")
    assert chart["data"][0]["x"] == ["h100-a", "a100-a"] and chart["data"][0]["y"] == [32, 16]


def test_the_capacity_page_plans_by_cost_from_a_link_and_shows_the_prices(
    dashboard: Dashboard, fleet: Fleet, live_registry: LiveRegistry
) -> None:
    seed_priced_fleet(live_registry)
    page = dashboard.open(
        f"/capacity?model={ARTICLE_MODEL}&users=30&min_tps_per_user=10&minimise=cost"
    )
    api = fleet.get(
        "/v1/capacity", model=ARTICLE_MODEL, users=30, min_tps_per_user=10, minimise="cost"
    )
    assert page.text_content("#reason") == api["reason"]
    assert page.input_value("select[name=minimise]") == "cost"
    # node, class, users, per user, total, $/h
    assert [row[:3] + row[5:6] for row in dashboard.table("#plan")] == [
        ["l4-a", L4, "16", "0.75"],
        ["l4-b", L4, "16", "0.75"],
    ]
    classes = {row[0]: row for row in dashboard.table("#classes")}
    assert classes[L4][1:5] == ["2", "2", "32", "1.50"]
    assert classes[A100][4:] == ["—", "—"]
