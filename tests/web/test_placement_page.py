"""The placement page in Chromium: the question as a form, the answer as a table and chart."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from fleetbench.agent.importer import declared_hardware
from tests.factories import ARTICLE_MODEL, ARTICLE_MODEL_INFO, make_serving_report, post_report
from tests.web.conftest import Dashboard, Fleet, apple_m4_pro, hours_ago
from tests.web.test_curves_page import H100, NVML, energy_points, set_price

# (B, S_PP, S_TG): per-user 60, 55, 50, 40, 25 tokens/s.
FAST_TABLE = [(1, 1000.0, 60.0), (2, 1900.0, 110.0), (4, 3600.0, 200.0), (8, 6000.0, 320.0),
              (16, 6500.0, 400.0)]  # fmt: skip


def ask(dashboard: Dashboard, tokens_per_user: str, **fields: str) -> None:
    page = dashboard.page
    page.fill("input[name=model]", fields.get("model", ARTICLE_MODEL))
    page.fill("input[name=min_tps_per_user]", tokens_per_user)
    for name in ("prompt_tokens", "context_tokens"):
        page.fill(f"input[name={name}]", fields.get(name, ""))
    page.click("button[type=submit]")


def test_the_form_gives_the_registry_answer(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.report("m4pro", started_at=hours_ago(3))
    fleet.report("rtx", table=FAST_TABLE, started_at=hours_ago(4), build_number=11500)

    page = dashboard.open("/placement", state="idle")
    ask(dashboard, "15")
    dashboard.wait()
    rows = dashboard.table("#candidates")
    # Highest total throughput first; each node at its largest concurrency meeting 15 t/s.
    # No class has a price and no run counted energy: no $ / M tok, $ / h or tokens / J.
    assert [r[:13] for r in rows] == [
        ["1", "rtx", "16", "25.00", "400.00", "—", "—", "—", "—", "offline curve", "6,500.00",
         "512 / 128", "b11500"],
        ["2", "m4pro", "8", "16.71", "133.65", "—", "—", "—", "—", "offline curve", "285.83",
         "512 / 128", "b11429"],
    ]  # fmt: skip
    api = fleet.get("/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=15)
    assert page.text_content("#reason") == api["reason"]
    assert page.text_content("#count") == "2 node(s) qualify."
    assert dashboard.trace_points("placement-chart") == {
        "total tokens/s": 2,
        "per-user tokens/s": 2,
    }
    chart = dashboard.chart("placement-chart")
    assert chart["data"][0]["x"] == ["rtx", "m4pro"]
    assert chart["data"][0]["y"] == [400.0, 133.65]
    assert chart["data"][1]["y"] == [25.0, 133.65 / 8]
    assert chart["layout"]["shapes"][0]["y0"] == 15  # the speed asked for
    # The question is in the address, so the answer can be shared.
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"model": [ARTICLE_MODEL], "min_tps_per_user": ["15"], "limit": ["100"]}
    assert page.get_attribute("#candidates a:text-is('rtx')", "href") == (
        f"/curves?node=rtx&model={ARTICLE_MODEL}"
    )
    dashboard.screenshot("placement")

    # 30 t/s per user: the M4 Pro is too slow even alone (28.3); the RTX drops to B=8.
    ask(dashboard, "30")
    dashboard.wait()
    assert [r[1:5] for r in dashboard.table("#candidates")] == [["rtx", "8", "40.00", "320.00"]]
    assert dashboard.trace_points("placement-chart") == {
        "total tokens/s": 1,
        "per-user tokens/s": 1,
    }

    # Nobody at 100 t/s: no table, no chart, and the registry's reason.
    ask(dashboard, "100")
    dashboard.wait("empty")
    api = fleet.get("/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=100)
    assert api["candidates"] == []
    assert page.text_content("#reason") == api["reason"]
    assert "60" in api["reason"]  # the best available: the RTX alone
    assert page.is_hidden("#candidates")
    assert page.is_hidden("#placement-chart")
    dashboard.screenshot("placement-nobody")
    dashboard.assert_clean()


def test_the_question_in_the_address_is_asked_on_load(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.report("m4pro", started_at=hours_ago(3))
    page = dashboard.open(f"/placement?model={ARTICLE_MODEL.lower()}.gguf&min_tps_per_user=15")
    assert page.input_value("input[name=min_tps_per_user]") == "15"
    assert [r[1:5] for r in dashboard.table("#candidates")] == [["m4pro", "8", "16.71", "133.65"]]
    dashboard.assert_clean()


def test_an_unknown_model_or_a_bad_value_is_explained(dashboard: Dashboard) -> None:
    dashboard.allow_console(r"status of (404|422)")
    page = dashboard.open("/placement?model=no-such-model&min_tps_per_user=15", state="error")
    assert page.text_content("[role=alert]") == ("404 Not Found: model 'no-such-model' not found")
    assert page.is_hidden("#answer")
    page.fill("input[name=limit]", "0")  # the browser allows it; the API does not (limit >= 1)
    page.eval_on_selector("#question", "f => f.noValidate = true")
    ask(dashboard, "15", model="x")
    dashboard.wait("error")
    alert = page.text_content("[role=alert]") or ""
    assert alert.startswith("422 Unprocessable")
    assert "limit" in alert
    dashboard.assert_clean()


def test_context_tokens_check_the_fit_and_show_what_was_refused(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    # Mistral NeMo's architecture: 40 layers, 8 KV heads of 128: 160 KiB of f16 KV cache per
    # token, 5 GiB per user at 32768 tokens. The M4 Pro lends Metal 75% of its 24 GiB: 18 GiB,
    # 7 of them weights, so two users fit, not eight. The RTX reports no hardware: unchecked.
    model = ARTICLE_MODEL_INFO
    fleet.report("m4pro", model=model, hardware=apple_m4_pro(), started_at=hours_ago(3))
    fleet.report("rtx", model=model, table=FAST_TABLE, started_at=hours_ago(4))

    page = dashboard.open("/placement", state="idle")
    ask(dashboard, "15", context_tokens="32768")
    dashboard.wait()
    api = fleet.get("/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=15, context_tokens=32768)
    kv = {c["node"]: c["kv_cache_gib"] for c in api["candidates"]}
    assert 10 <= kv["m4pro"] < 10.5
    rows = dashboard.table("#candidates")
    assert [r[1:5] + r[10:11] + r[13:16] for r in rows] == [
        ["rtx", "16", "25.00", "400.00", "6,500.00", "past knee", f"{kv['rtx']:.2f}",
         "not checked"],
        ["m4pro", "2", "21.07", "42.14", "275.77", "up to knee", f"{kv['m4pro']:.2f}",
         "fits (predicted)"],  # its run logged no buffers: the file's size stands for them
    ]  # fmt: skip
    assert page.text_content("#reason") == api["reason"]
    [refused] = api["rejected"]
    assert (refused["node"], refused["concurrency"]) == ("m4pro", 8)
    assert "at most 2 users fit" in refused["reason"]
    assert page.is_visible("#rejected-section")
    assert dashboard.table("#rejected") == [
        ["m4pro", "8", f"{refused['kv_cache_gib']:.2f}", refused["reason"]]
    ]
    assert dashboard.trace_points("placement-chart") == {
        "total tokens/s": 2,
        "per-user tokens/s": 2,
    }
    dashboard.screenshot("placement-context")

    # Without a context the fit is not checked and nothing is refused.
    ask(dashboard, "15")
    dashboard.wait()
    assert [r[1:3] for r in dashboard.table("#candidates")] == [["rtx", "16"], ["m4pro", "8"]]
    assert page.is_hidden("#rejected-section")
    dashboard.assert_clean()


def test_a_latency_objective_answers_from_serving_runs(dashboard: Dashboard, fleet: Fleet) -> None:
    fleet.report("m4pro", started_at=hours_ago(3))
    fleet.report("rtx", table=FAST_TABLE, started_at=hours_ago(4), build_number=11500)
    served = make_serving_report(
        node="rtx",
        model=ARTICLE_MODEL,
        points=[(1, 50.0, 45.0, 100.0), (4, 160.0, 35.0, 400.0), (8, 200.0, 20.0, 2500.0)],
        started_at=hours_ago(1),
    )
    with fleet.registry.client(fleet.node("rtx")) as client:
        assert post_report(client, served).status_code == 201

    page = dashboard.open("/placement", state="idle")
    page.fill("input[name=max_ttft_ms]", "500")
    ask(dashboard, "15")
    dashboard.wait()
    rows = dashboard.table("#candidates")
    assert [r[1:5] + r[8:10] for r in rows] == [
        ["rtx", "4", "35.00", "160.00", "400", "llama-server (4 slots)"]
    ]
    api = fleet.get("/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=15, max_ttft_ms=500)
    assert page.text_content("#reason") == api["reason"]
    assert "meeting the speed on their offline curves alone are left out" in api["reason"]
    assert parse_qs(urlsplit(page.url).query)["max_ttft_ms"] == ["500"]

    # Offline curves alone: both nodes, by their engines' figures.
    page.fill("input[name=max_ttft_ms]", "")
    page.select_option("select[name=kind]", "offline")
    ask(dashboard, "15")
    dashboard.wait()
    assert [r[1:3] + r[9:10] for r in dashboard.table("#candidates")] == [
        ["rtx", "16", "offline curve"],
        ["m4pro", "8", "offline curve"],
    ]
    assert parse_qs(urlsplit(page.url).query)["kind"] == ["offline"]
    dashboard.assert_clean()


def test_cost_order_lists_the_cheapest_per_million_tokens_first(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    # The H100 at $4 an hour counted its energy: 2048 tokens at B=16 for 512 J, 4 tokens/J.
    joules = [128.0, 160.0, 204.8, 320.0, 512.0]
    fleet.report(
        "h100-1",
        hardware=declared_hardware(H100),
        energy=NVML,
        points=energy_points(FAST_TABLE, joules),
        started_at=hours_ago(3),
    )
    fleet.report("m4pro", hardware=declared_hardware("Apple M4 Pro"), started_at=hours_ago(3))
    # No hardware reported: no class, so no price. 200 t/s at B=8 (25 per user).
    slower = [(1, 1000.0, 50.0), (2, 1000.0, 90.0), (4, 1000.0, 160.0), (8, 1000.0, 200.0)]
    fleet.report("unpriced", table=slower, started_at=hours_ago(3))
    set_price(fleet, H100, 4.0)
    set_price(fleet, "Apple M4 Pro", 0.5)

    page = dashboard.open("/placement", state="idle")
    ask(dashboard, "15")
    dashboard.wait()
    assert [r[1] for r in dashboard.table("#candidates")] == ["h100-1", "unpriced", "m4pro"]

    page.select_option("select[name=order]", "cost")
    ask(dashboard, "15")
    dashboard.wait()
    # $ / M tok = $ an hour / (total t/s x 3600) x 10^6: 0.5 / (133.65 x 3600) x 10^6 = 1.04,
    # 4 / (400 x 3600) x 10^6 = 2.78; the unpriced node last.
    assert [r[1:8] for r in dashboard.table("#candidates")] == [
        ["m4pro", "8", "16.71", "133.65", "1.04", "0.50", "—"],
        ["h100-1", "16", "25.00", "400.00", "2.78", "4.00", "4.00"],
        ["unpriced", "8", "25.00", "200.00", "—", "—", "—"],
    ]
    api = fleet.get("/v1/placement", model=ARTICLE_MODEL, min_tps_per_user=15, order="cost")
    assert page.text_content("#reason") == api["reason"]
    assert api["candidates"][1]["tokens_per_joule"] == 4.0
    assert page.get_attribute("#candidates tr[data-node='h100-1'] td:nth-child(8)", "title") == (
        "counted by nvml"
    )
    assert page.get_attribute("#candidates tr[data-node='unpriced'] td:nth-child(7)", "title") == (
        "no price for its hardware, which names no class: an admin sets one with "
        "fleetbench-registry price set"
    )
    assert parse_qs(urlsplit(page.url).query)["order"] == ["cost"]
    title = dashboard.chart("placement-chart")["layout"]["title"]["text"]
    assert title == f"{ARTICLE_MODEL}: cheapest per million tokens first at ≥ 15 t/s per user"
    assert dashboard.chart("placement-chart")["data"][0]["x"] == ["m4pro", "h100-1", "unpriced"]
    dashboard.screenshot("placement-cost")

    page.fill("input[name=limit]", "2")
    ask(dashboard, "15")
    dashboard.wait()
    assert page.text_content("#count") == (
        "3 node(s) qualify; the 2 cheapest per million tokens are shown."
    )
    assert [r[1] for r in dashboard.table("#candidates")] == ["m4pro", "h100-1"]
    dashboard.assert_clean()
