"""What tokens cost (issue 40, in part): each hardware class's price per hour as an admin sets
it (`/v1/prices`, `fleetbench-registry price`), each placement candidate's price of a million
tokens, and placement cheapest first."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fleetbench.agent.importer import declared_hardware
from fleetbench.registry.prices.rules import usd_per_million_tokens
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    LiveRegistry,
    agent,
    make_report,
    post_report,
    registry_cli,
)

H100, M4_PRO = "NVIDIA H100 80GB HBM3", "Apple M4 Pro"
# A faster, dearer node: 480 t/s at B = 16 (30 per user)
FAST = [(1, 900.0, 90.0), (2, 900.0, 170.0), (4, 900.0, 300.0), (8, 900.0, 400.0),
        (16, 900.0, 480.0)]  # fmt: skip


def test_a_million_tokens_cost_the_hourly_price_over_the_tokens_an_hour_makes() -> None:
    # the article's M4 Pro at an assumed $2 an hour, by hand: $2 / (S_TG x 3600 s) x 10^6
    by_hand = {1: 19.63, 2: 13.18, 4: 7.98, 8: 4.16, 16: 3.40, 32: 2.87}
    priced = {b: usd_per_million_tokens(2.0, s_tg) for b, _, s_tg in ARTICLE_TABLE}
    assert {b: round(usd, 2) for b, usd in priced.items() if usd is not None} == by_hand
    assert usd_per_million_tokens(2.0, 0.0) is None


def _admin(registry: LiveRegistry) -> httpx.Client:
    return registry.client(registry.scoped_token("admin", name="ops"))


def _placement(registry: LiveRegistry, **params: Any) -> dict[str, Any]:
    with registry.client() as client:
        response = client.get(
            "/v1/placement", params={"model": ARTICLE_MODEL, "min_tps_per_user": 10, **params}
        )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _report(registry: LiveRegistry, node: str, device: str, table: Any = None) -> None:
    report = make_report(node=node, hardware=declared_hardware(device), table=table)
    with registry.client(registry.token(node)) as client:
        assert post_report(client, report).status_code == 201


def test_an_admin_sets_lists_and_removes_a_class_s_price(live_registry: LiveRegistry) -> None:
    body = {"hardware_class": H100, "usd_per_hour": 3.5}
    with live_registry.client(live_registry.scoped_token("reader")) as reader:
        assert reader.put("/v1/prices", json=body).status_code == 403
    with live_registry.client() as anyone:
        assert anyone.put("/v1/prices", json=body).status_code == 401
    with _admin(live_registry) as admin:
        set_ = admin.put("/v1/prices", json=body)
        assert set_.status_code == 200, set_.text
        assert set_.json()["usd_per_hour"] == 3.5
        assert set_.json()["set_by"].startswith("ops (token ")
        assert admin.put("/v1/prices", json={**body, "usd_per_hour": 2.5}).status_code == 200
        for refused in (0, 5e-324, -1, "a lot"):
            assert (
                admin.put("/v1/prices", json={**body, "usd_per_hour": refused}).status_code == 422
            )
        # a node's `hardware`, driver and all, names its class
        with_driver = {**body, "hardware_class": f"  {H100} (driver 550.54.15) "}
        assert admin.put("/v1/prices", json=with_driver).json()["hardware_class"] == H100
        listed = admin.get("/v1/prices").json()
        assert [(p["hardware_class"], p["usd_per_hour"]) for p in listed["data"]] == [(H100, 3.5)]
        nul = admin.delete("/v1/prices", params={"hardware_class": "a\x00b"})
        assert nul.status_code == 422
        assert admin.delete("/v1/prices", params={"hardware_class": H100}).status_code == 204
        gone = admin.delete("/v1/prices", params={"hardware_class": H100})
        assert gone.status_code == 404 and H100 in gone.json()["detail"]
        assert admin.get("/v1/prices").json() == {"data": [], "count": 0}


def test_placement_prices_each_candidate_and_lists_the_cheapest_first(
    live_registry: LiveRegistry,
) -> None:
    _report(live_registry, "h100-1", H100, FAST)
    _report(live_registry, "m4pro", M4_PRO)
    _report(live_registry, "unpriced", "an unlisted box", FAST)
    with _admin(live_registry) as admin:
        for hardware_class, usd in ((H100, 4.0), (M4_PRO, 0.5)):
            body = {"hardware_class": hardware_class, "usd_per_hour": usd}
            assert admin.put("/v1/prices", json=body).status_code == 200

    with live_registry.client() as reader:
        nodes = {n["name"]: n["hardware_class"] for n in reader.get("/v1/nodes").json()["data"]}
    assert nodes == {"h100-1": H100, "m4pro": M4_PRO, "unpriced": "an unlisted box"}

    by_throughput = _placement(live_registry)
    assert [c["node"] for c in by_throughput["candidates"]] == ["h100-1", "unpriced", "m4pro"]
    h100 = by_throughput["candidates"][0]
    assert (h100["hardware_class"], h100["usd_per_hour"]) == (H100, 4.0)
    assert h100["usd_per_million_tokens"] == pytest.approx(4 / (480 * 3600) * 1e6)  # $2.31
    assert by_throughput["candidates"][1]["usd_per_million_tokens"] is None

    # the M4 Pro serves fewer users more slowly, for less: $0.85 a million tokens at B = 16
    by_cost = _placement(live_registry, order="cost")
    assert by_cost["order"] == "cost"
    assert [c["node"] for c in by_cost["candidates"]] == ["m4pro", "h100-1", "unpriced"]
    assert by_cost["candidates"][0]["usd_per_million_tokens"] == pytest.approx(
        0.5 / (163.18 * 3600) * 1e6
    )
    assert "cheapest per million tokens first, 1 without a price" in by_cost["reason"]
    cheapest = _placement(live_registry, order="cost", limit=1)
    assert [c["node"] for c in cheapest["candidates"]] == ["m4pro"]
    assert cheapest["count"] == 3

    table = agent(
        "placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "10", "--order", "cost",
        "--registry", live_registry.url,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if line.startswith("│ ")]
    cells = [[cell.strip() for cell in row.strip("│").split("│")] for row in rows]
    assert [(c[0], c[9]) for c in cells] == [
        ("m4pro", "0.85"),
        ("h100-1", "2.31"),
        ("unpriced", "-"),
    ]


def test_the_registry_cli_sets_lists_and_removes_prices(live_registry: LiveRegistry) -> None:
    url = live_registry.engine.url.render_as_string(hide_password=False)
    env = {"FLEETBENCH_DATABASE_URL": url}
    set_ = registry_cli("price", "set", M4_PRO, "0.5", **env)
    assert set_.returncode == 0, set_.stderr
    listed = registry_cli("price", "list", "--json", **env)
    assert [(p["hardware_class"], p["usd_per_hour"]) for p in json.loads(listed.stdout)] == [
        (M4_PRO, 0.5)
    ]
    bad = registry_cli("price", "set", M4_PRO, "0", **env)
    assert bad.returncode == 2 and "USD_PER_HOUR" in bad.stderr and "Traceback" not in bad.stderr
    assert registry_cli("price", "remove", M4_PRO, **env).returncode == 0
    again = registry_cli("price", "remove", M4_PRO, **env)
    assert again.returncode == 1 and "no price is set for 'Apple M4 Pro'" in again.stderr
