"""Capacity planned by cost (GET /v1/capacity?minimise=cost, `capacity --minimise cost`): the
cheapest nodes an hour serving N users, exact against brute force on small fleets, greedy
within its stated bound on large ones; end to end on both databases, a cheaper, slower class
chosen over a fast, dear node, the unpriced left out."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetbench.registry.capacity import cheapest
from fleetbench.registry.capacity.cheapest import CheapestPlan, cheapest_nodes, greedy_plan
from fleetbench.registry.capacity.rules import NodeOffer, Plan
from tests.factories import ARTICLE_MODEL, LiveRegistry, agent, make_report, post_report
from tests.registry.test_capacity import MIN_TPS, OFFERS, capacity, offering
from tests.registry.test_compare import A100, H100, gpu

# The key plans are ranked by: the price (exact), then fewer nodes, then more users.
Rank = tuple[Fraction, int, int]


def rank(nodes: tuple[NodeOffer, ...] | list[NodeOffer]) -> Rank:
    price = sum((Fraction(_usd(n)) for n in nodes), Fraction(0))
    return (price, len(nodes), -sum(n.users for n in nodes))


def _usd(offer: NodeOffer) -> float:
    assert offer.usd_per_hour is not None
    return offer.usd_per_hour


def brute_force_cheapest(offers: list[NodeOffer], users: int) -> Rank | None:
    priced = [o for o in offers if o.usd_per_hour is not None]
    serving = (
        chosen
        for size in range(len(priced) + 1)
        for chosen in itertools.combinations(priced, size)
        if sum(o.users for o in chosen) >= users
    )
    return min(map(rank, serving), default=None)


def assert_a_plan_of(plan: Plan, fleet: list[NodeOffer]) -> None:
    """Each node once, priced, as offered (never more than it serves)."""
    names = [n.node for n in plan.nodes]
    assert len(names) == len(set(names))
    offered = {o.node: o for o in fleet}
    assert all(n == offered[n.node] and n.usd_per_hour is not None for n in plan.nodes)
    assert [n.users for n in plan.nodes] == sorted((n.users for n in plan.nodes), reverse=True)


def assert_greedy_within_its_bound(found: CheapestPlan, optimum: Rank | None = None) -> None:
    """lower bound <= the cheapest <= greedy's price <= lower bound + its dearest node."""
    plan, bound = found.plan, found.lower_bound_usd_per_hour
    assert found.exact is False and plan.enough and plan.users_served >= plan.users
    assert bound is not None and plan.usd_per_hour is not None
    assert bound <= plan.usd_per_hour + 1e-9
    assert plan.usd_per_hour <= bound + max(_usd(n) for n in plan.nodes) + 1e-9
    assert found.most_saved_usd_per_hour == pytest.approx(plan.usd_per_hour - bound)
    if optimum is not None:
        assert bound <= float(optimum[0]) + 1e-9 and rank(plan.nodes)[0] >= optimum[0]


# 0.1 + 0.2 is no dearer than 0.3: equal prices must tie exactly, and go to fewer nodes
PRICES = [None, 0.1, 0.2, 0.3, 0.5, 1.0, 1.5, 2.49]
fleets = st.lists(
    st.tuples(st.integers(0, 8), st.sampled_from(PRICES), st.sampled_from(["H100", "L4"])),
    max_size=10,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(offers=fleets, users=st.integers(1, 40))
def test_the_exact_plan_is_the_cheapest_and_greedy_keeps_within_its_bound(
    offers: list[tuple[int, float | None, str]], users: int
) -> None:
    fleet = [NodeOffer(f"n{i}", hw, u, u * 12.0, usd) for i, (u, usd, hw) in enumerate(offers)]
    found = cheapest_nodes(fleet, users)
    assert_a_plan_of(found.plan, fleet)
    optimum = brute_force_cheapest(fleet, users)
    if optimum is None:  # every priced node serving a user, short of the users
        serving = {o.node for o in fleet if o.usd_per_hour is not None and o.users > 0}
        assert not found.plan.enough and {n.node for n in found.plan.nodes} == serving
        assert found.exact is None and found.lower_bound_usd_per_hour is None
        return
    assert found.exact is True and found.plan.enough
    assert rank(found.plan.nodes) == optimum  # the price, then fewer nodes, then more users
    assert found.lower_bound_usd_per_hour == found.plan.usd_per_hour
    assert found.most_saved_usd_per_hour == 0
    priced = [o for o in fleet if o.usd_per_hour is not None and o.users > 0]
    greedy = greedy_plan(priced, users)
    assert_a_plan_of(greedy.plan, fleet)
    assert_greedy_within_its_bound(greedy, optimum)


def test_greedy_can_miss_the_cheapest_and_says_by_how_much_at_most() -> None:
    # the best price per user (a) first, then b; b + c serve the same for less
    fleet = [NodeOffer("a", "x", 6, 60.0, 6.0), *(NodeOffer(n, "y", 5, 50.0, 5.5) for n in "bc")]
    greedy = greedy_plan(fleet, 10)
    assert [n.node for n in greedy.plan.nodes] == ["a", "b"]
    assert greedy.plan.usd_per_hour == 11.5
    # the fractional plan: a, and 4 of b's 5 users
    assert greedy.lower_bound_usd_per_hour == pytest.approx(6.0 + 5.5 * 4 / 5)
    assert_greedy_within_its_bound(greedy)
    exact = cheapest_nodes(fleet, 10)
    assert exact.exact and [n.node for n in exact.plan.nodes] == ["b", "c"]
    assert exact.plan.usd_per_hour == 11.0


def test_greedy_drops_the_dearest_nodes_no_longer_needed() -> None:
    # cheapest per user first: small (1 user), then big (10 users), which alone serves 10
    fleet = [NodeOffer("small", "x", 1, 10.0, 0.5), NodeOffer("big", "y", 10, 100.0, 6.0)]
    greedy = greedy_plan(fleet, 10)
    assert [n.node for n in greedy.plan.nodes] == ["big"] and greedy.plan.usd_per_hour == 6.0


def test_identical_nodes_are_planned_as_one_offer_so_large_classes_stay_exact() -> None:
    # 900 nodes, 3000 users: one step per node would be 900 x 3001 cells, past EXACT_WORK;
    # as three offers taken up to 300 times each, about 30 steps
    fleet = [
        NodeOffer(f"{name}-{i:03d}", name, users, users * 11.0, usd)
        for name, users, usd in (("l4", 4, 0.75), ("a100", 10, 2.0), ("h100", 16, 4.0))
        for i in range(300)
    ]
    assert len(fleet) * 3001 > cheapest.EXACT_WORK
    found = cheapest_nodes(fleet, 3000)
    assert found.exact is True
    # per user: l4 0.1875, a100 0.2, h100 0.25: every l4 (1200), then 180 a100s (1800)
    used = {
        name: sum(1 for n in found.plan.nodes if n.hardware_class == name)
        for name in ("l4", "a100", "h100")
    }
    assert used == {"l4": 300, "a100": 180, "h100": 0}
    assert found.plan.usd_per_hour == pytest.approx(300 * 0.75 + 180 * 2.0)
    # the first of a class by name are taken
    assert {n.node for n in found.plan.nodes if n.hardware_class == "a100"} == {
        f"a100-{i:03d}" for i in range(180)
    }


def test_a_question_too_large_to_plan_exactly_is_planned_greedily_within_its_bound() -> None:
    rng = random.Random(7)
    fleet = [
        NodeOffer(f"n{i}", "x", rng.randint(1000, 5000), 1e4, round(rng.uniform(0.5, 5.0), 2))
        for i in range(50)
    ]
    users = 100_000
    assert sum(o.users for o in fleet) >= users
    found = cheapest_nodes(fleet, users)
    assert_greedy_within_its_bound(found)
    assert found.plan.users_served - max(n.users for n in found.plan.nodes) < users


def test_offers_without_a_price_or_a_user_are_never_planned_by_cost() -> None:
    fleet = [NodeOffer("free", "x", 8, 80.0, None), NodeOffer("idle", "y", 0, 0.0, 0.1)]
    found = cheapest_nodes(fleet, 1)
    assert found.plan.nodes == () and not found.plan.enough and found.exact is None
    assert found.plan.usd_per_hour is None and found.plan.usd_per_million_tokens is None


# End to end: a fast, dear H100 against two slow, cheap L4s, and an A100 nobody priced.

L4 = "NVIDIA L4"
USERS = 30


def seed_priced_fleet(registry: LiveRegistry) -> None:
    fleet = {"h100-fast": (H100, 32), "l4-a": (L4, 16), "l4-b": (L4, 16), "a100-x": (A100, 16)}
    for node, (card, users) in fleet.items():
        report = make_report(
            node=node,
            table=offering(OFFERS[users]),
            hardware=gpu(card, node),
            started_at=datetime.now(UTC) - timedelta(hours=1),
        )
        with registry.client(registry.token(node)) as client:
            assert post_report(client, report).status_code == 201
    with registry.client(registry.scoped_token("admin", name="ops")) as admin:
        for hardware_class, usd in ((H100, 4.0), (L4, 0.75)):
            body = {"hardware_class": hardware_class, "usd_per_hour": usd}
            assert admin.put("/v1/prices", json=body).status_code == 200


def per_million(usd_per_hour: float, total_tps: float) -> float:
    return usd_per_hour / (total_tps * 3600) * 1e6


def test_the_cost_plan_takes_cheaper_slower_nodes_the_nodes_plan_the_fast_one(
    live_registry: LiveRegistry,
) -> None:
    seed_priced_fleet(live_registry)
    fewest = capacity(live_registry, users=USERS)
    assert fewest["minimise"] == "nodes"
    assert [(n["node"], n["usd_per_hour"]) for n in fewest["plan"]] == [("h100-fast", 4.0)]
    assert fewest["usd_per_hour"] == 4.0
    assert fewest["usd_per_million_tokens"] == pytest.approx(per_million(4.0, fewest["total_tps"]))
    assert fewest["exact"] is None and fewest["lower_bound_usd_per_hour"] is None
    assert fewest["reason"].startswith("1 node serves 30 users with room for 2 more for $4.00/h")

    cost = capacity(live_registry, users=USERS, minimise="cost")
    assert cost["minimise"] == "cost" and cost["enough"] and cost["nodes_needed"] == 2
    assert [(n["node"], n["users"], n["usd_per_hour"]) for n in cost["plan"]] == [
        ("l4-a", 16, 0.75),
        ("l4-b", 16, 0.75),
    ]
    assert all(n["per_user_tps"] >= MIN_TPS for n in cost["plan"])
    assert (cost["usd_per_hour"], cost["exact"], cost["lower_bound_usd_per_hour"]) == (
        1.5,
        True,
        1.5,
    )
    assert cost["usd_per_million_tokens"] == pytest.approx(per_million(1.5, cost["total_tps"]))
    assert cost["usd_per_million_tokens"] < fewest["usd_per_million_tokens"]
    refused = {r["node"]: r["reason"] for r in cost["refused"]}
    assert refused == {
        "a100-x": f"no price for its class {A100}: "
        f'fleetbench-registry price set "{A100}" USD_PER_HOUR (or PUT /v1/prices)'
    }
    assert cost["reason"] == (
        "the cheapest: 2 nodes serve 30 users with room for 2 more for $1.50/h "
        f"(${cost['usd_per_million_tokens']:.2f} per million tokens); "
        "1 node left out (see refused)"
    )
    for answer in (fewest, cost):  # each class alone, priced where it has a price
        classes = {c["hardware_class"]: c for c in answer["per_class"]}
        assert (classes[H100]["nodes_needed"], classes[H100]["usd_per_hour"]) == (1, 4.0)
        assert (classes[L4]["nodes_needed"], classes[L4]["usd_per_hour"]) == (2, 1.5)
        assert classes[L4]["usd_per_million_tokens"] == pytest.approx(
            per_million(1.5, classes[L4]["total_tps"])
        )
        assert (classes[A100]["nodes_needed"], classes[A100]["usd_per_hour"]) == (None, None)

    # more users than the priced nodes serve: the unpriced A100 would not be planned on
    short = capacity(live_registry, users=70, minimise="cost")
    assert not short["enough"] and short["exact"] is None
    assert short["users_served"] == 64 and short["usd_per_hour"] == 5.5
    assert short["reason"].startswith("not enough: the 3 eligible priced nodes serve 64 of 70")


def test_a_question_too_large_to_plan_exactly_says_how_far_from_the_cheapest_it_may_be(
    live_registry: LiveRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_priced_fleet(live_registry)
    monkeypatch.setattr(cheapest, "EXACT_WORK", 0)  # (the registry serves in this process)
    greedy = capacity(live_registry, users=USERS, minimise="cost")
    assert [n["node"] for n in greedy["plan"]] == ["l4-a", "l4-b"]
    # the fractional plan: l4-a, and 14 of l4-b's 16 users
    bound = 0.75 + 0.75 * 14 / 16
    assert greedy["exact"] is False
    assert greedy["lower_bound_usd_per_hour"] == pytest.approx(bound)
    assert greedy["reason"].startswith("planned greedily: 2 nodes serve 30 users")
    assert f"at most ${1.5 - bound:.2f}/h above the cheapest possible" in greedy["reason"]


def cells(stdout: str) -> dict[str, list[str]]:
    rows = [line.strip("│").split("│") for line in stdout.splitlines() if line.startswith("│ ")]
    return {row[0].strip(): [cell.strip() for cell in row] for row in rows}


def test_the_agent_cli_plans_by_cost_and_shows_the_prices(live_registry: LiveRegistry) -> None:
    seed_priced_fleet(live_registry)
    asked = ["--model", ARTICLE_MODEL, "--users", str(USERS), "--min-tps-per-user", str(MIN_TPS)]
    done = agent("capacity", *asked, "--minimise", "cost", "--registry", live_registry.url)
    assert done.returncode == 0, done.stderr
    rows = cells(done.stdout)
    # node, hardware, users, per user, total, $/h, $/M tok, build, age, from
    assert rows["l4-a"][:3] == ["l4-a", L4, "16"] and rows["l4-a"][5:7] == ["0.75", ""]
    assert "h100-fast" not in rows
    by_class = {row[1]: row for name, row in rows.items() if name.endswith("alone)")}
    assert by_class[H100][5] == "4.00" and by_class[L4][5] == "1.50"
    assert rows["a100-x"][-1].startswith(f"left out: no price for its class {A100}")
    assert "the cheapest: 2 nodes serve 30 users with room for 2 more for $1.50/h" in done.stdout
    refused = agent("capacity", *asked, "--minimise", "most", "--registry", live_registry.url)
    assert refused.returncode == 2 and "most" in refused.stderr


def test_an_unpriced_fleet_s_table_has_no_price_columns(live_registry: LiveRegistry) -> None:
    report = make_report(
        node="a100-x",
        table=offering(OFFERS[16]),
        hardware=gpu(A100, "a100-x"),
        started_at=datetime.now(UTC) - timedelta(hours=1),
    )
    with live_registry.client(live_registry.token("a100-x")) as client:
        assert post_report(client, report).status_code == 201
    asked = ["--model", ARTICLE_MODEL, "--users", "4", "--min-tps-per-user", str(MIN_TPS)]
    done = agent("capacity", *asked, "--registry", live_registry.url)
    assert done.returncode == 0, done.stderr
    assert "$/h" not in done.stdout and "1 node serves 4 users with room for 12" in done.stdout
    answer: dict[str, Any] = capacity(live_registry, users=4)
    assert answer["usd_per_hour"] is None and answer["per_class"][0]["usd_per_hour"] is None
