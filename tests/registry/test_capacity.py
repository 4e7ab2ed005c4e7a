"""Capacity plans (GET /v1/capacity): how many of which nodes serve N users at X tokens/s
each, on a seeded mixed fleet on both databases, and the planner's properties checked
against brute force on small fleets."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetbench.registry.capacity.rules import NodeOffer, fewest_nodes, plans_per_class
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    LiveRegistry,
    agent,
    make_report,
    post_report,
)
from tests.registry.test_compare import A100, H100, gpu

MIN_TPS = 10.0


def offering(lone_user_tps: float) -> list[tuple[int, float, float]]:
    """A curve whose per-user speed falls 5% each doubling of B (no knee up to 32): a node
    whose lone user decodes `lone_user_tps` offers the largest B still at MIN_TPS."""
    return [
        (b, 500.0, b * lone_user_tps * 0.95 ** (b.bit_length() - 1)) for b in (1, 2, 4, 8, 16, 32)
    ]


# lone-user speeds offering 32, 16, 8, 4 and 2 users at MIN_TPS
OFFERS = {32: 20.0, 16: 12.5, 8: 11.8, 4: 11.2, 2: 10.6}
FLEET = {
    "h100-a": (H100, 32),
    "h100-b": (H100, 16),
    "h100-c": (H100, 4),
    "a100-a": (A100, 16),
    "a100-b": (A100, 8),
    "a100-c": (A100, 8),
    "a100-d": (A100, 2),
}


def seed_fleet(registry: LiveRegistry) -> None:
    now = datetime.now(UTC)
    reports = [
        make_report(
            node=node,
            table=offering(OFFERS[users]),
            hardware=gpu(card, node),
            started_at=now - timedelta(hours=1),
        )
        for node, (card, users) in FLEET.items()
    ]
    reports += [
        # would offer 32 users, but measured a week ago
        make_report(
            node="h100-stale",
            table=offering(OFFERS[32]),
            hardware=gpu(H100, "h100-stale"),
            started_at=now - timedelta(days=7),
        ),
        # the article's curve: 10.2 tokens/s per user at B=16, past its knee at 8
        make_report(node="m4-knee", table=ARTICLE_TABLE, started_at=now - timedelta(hours=2)),
    ]
    for report in reports:
        with registry.client(registry.token(report.node)) as client:
            assert post_report(client, report).status_code == 201


def capacity(registry: LiveRegistry, **query: Any) -> dict[str, Any]:
    params = {"model": ARTICLE_MODEL, "min_tps_per_user": MIN_TPS} | query
    with registry.client() as client:
        response = client.get("/v1/capacity", params=params)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_mixed_fleet_gets_the_fewest_nodes_and_what_each_class_alone_needs(
    live_registry: LiveRegistry,
) -> None:
    seed_fleet(live_registry)
    answer = capacity(live_registry, users=40, reserve=["h100-b"])
    assert answer["enough"] and answer["nodes_needed"] == 2
    assert [(n["node"], n["users"]) for n in answer["plan"]] == [("h100-a", 32), ("a100-a", 16)]
    assert (answer["users_served"], answer["headroom_users"]) == (48, 8)
    for node in answer["plan"]:
        assert node["per_user_tps"] >= MIN_TPS and node["age_days"] < 0.1
        assert node["llama_cpp_build"] == 11429 and node["source"] == "offline"
    assert answer["total_tps"] == sum(n["total_tps"] for n in answer["plan"])
    classes = {c["hardware_class"]: c for c in answer["per_class"]}
    # h100-b reserved: the other two serve 36, not enough alone
    assert (classes[H100]["nodes_available"], classes[H100]["nodes_needed"]) == (2, None)
    assert classes[H100]["users_served"] == 36
    assert (classes[A100]["nodes_needed"], classes[A100]["users_served"]) == (None, 34)
    refused = {r["node"]: r["reason"] for r in answer["refused"]}
    assert refused.keys() == {"h100-b", "h100-stale", "m4-knee"}
    assert refused["h100-b"] == "reserved"
    assert refused["h100-stale"].startswith("stale: measured")
    assert refused["m4-knee"].startswith("B=16 lies past its knee")
    assert (
        answer["reason"]
        == "2 nodes serve 40 users with room for 8 more; 3 nodes left out (see refused)"
    )


def test_the_agent_cli_prints_the_plan_the_classes_and_who_was_left_out(
    live_registry: LiveRegistry,
) -> None:
    seed_fleet(live_registry)
    asked = ["--model", ARTICLE_MODEL, "--users", "40", "--min-tps-per-user", "10"]
    done = agent("capacity", *asked, "--reserve", "h100-b", "--registry", live_registry.url)
    assert done.returncode == 0, done.stderr
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if "│" in line}
    assert "32" in rows["h100-a"] and "16" in rows["a100-a"] and "11429" in rows["h100-a"]
    assert "left out: reserved" in rows["h100-b"]
    assert "2 nodes serve 40 users with room for 8 more" in done.stdout
    assert "not enough" in done.stdout  # the A100s alone
    answer = json.loads(agent("capacity", *asked, "--json", "--registry", live_registry.url).stdout)
    assert answer["nodes_needed"] == 2  # nothing reserved: h100-b is a candidate again
    assert "h100-b" not in {r["node"] for r in answer["refused"]}


def test_more_users_than_the_fleet_serves_says_how_many_it_does(
    live_registry: LiveRegistry,
) -> None:
    seed_fleet(live_registry)
    answer = capacity(live_registry, users=1000)
    assert not answer["enough"] and answer["nodes_needed"] is None
    assert answer["users_served"] == 32 + 16 + 4 + 16 + 8 + 8 + 2
    assert answer["headroom_users"] == answer["users_served"] - 1000
    assert answer["reason"].startswith("not enough: the 7 eligible nodes serve 86 of 1000 users")


def test_capacity_refuses_bad_questions_naming_the_field(live_registry: LiveRegistry) -> None:
    with live_registry.client() as client:
        for params, field in (
            ({"users": 0}, "users"),
            ({"users": 5, "kind": "offline", "max_ttft_ms": 100}, "max_ttft_ms"),
            ({"users": "many"}, "users"),
            ({"users": 5, "minimise": "fast"}, "minimise"),
            ({"users": 5, "minimise": ""}, "minimise"),
        ):
            asked = {"model": ARTICLE_MODEL, "min_tps_per_user": 10, **params}
            response = client.get("/v1/capacity", params=asked)
            assert response.status_code == 422
            assert field in {e["loc"][-1] for e in response.json()["detail"]}
        unknown = {"model": "nope", "min_tps_per_user": 10, "users": 3}
        assert client.get("/v1/capacity", params=unknown).status_code == 404


# The planner against brute force.


def brute_force_minimum(offers: list[NodeOffer], users: int) -> int | None:
    for size in range(len(offers) + 1):
        for chosen in itertools.combinations(offers, size):
            if sum(o.users for o in chosen) >= users:
                return size
    return None


offer_lists = st.lists(
    st.tuples(st.integers(0, 64), st.sampled_from(["H100", "A100", "M4"])), max_size=9
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(offers=offer_lists, users=st.integers(1, 300))
def test_the_plan_is_minimal_uses_each_node_once_and_never_more_than_it_offers(
    offers: list[tuple[int, str]], users: int
) -> None:
    fleet = [NodeOffer(f"n{i}", hw, u, u * 10.0) for i, (u, hw) in enumerate(offers)]
    plan = fewest_nodes(fleet, users)
    names = [n.node for n in plan.nodes]
    assert len(names) == len(set(names))
    offered = {o.node: o for o in fleet}
    assert all(n == offered[n.node] for n in plan.nodes)  # as measured, never more
    minimum = brute_force_minimum(fleet, users)
    if minimum is None:
        assert not plan.enough and plan.users_served == sum(o.users for o in fleet)
    else:
        assert plan.enough and len(plan.nodes) == minimum and plan.users_served >= users
    for name, alone in plans_per_class(fleet, users).items():
        mine = [o for o in fleet if o.hardware_class == name]
        assert {n.node for n in alone.nodes} <= {o.node for o in mine}
        assert (len(alone.nodes) if alone.enough else None) == brute_force_minimum(mine, users)


def test_an_unused_offer_of_no_users_is_never_planned() -> None:
    plan = fewest_nodes([NodeOffer("idle", "H100", 0, 0.0)], 1)
    assert plan.nodes == () and not plan.enough and plan.headroom == -1
