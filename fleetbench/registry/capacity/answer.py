"""The capacity answer: each node's placement candidate (registry.placement: its largest
concurrency meeting the speed, memory fit included, its class's price) as the users it
offers, the nodes whose curves should not be planned on left out with the reason, and the
fewest nodes serving the users (registry.capacity.rules) or the cheapest
(registry.capacity.cheapest), found by the pure planners."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from fleetbench.contract.answers import (
    BLIND_ABOVE_PCT,
    CapacityAnswer,
    CapacityClass,
    CapacityMinimise,
    CapacityNode,
    CapacityRefusal,
    PlacementCandidate,
)
from fleetbench.registry.capacity.cheapest import CheapestPlan, cheapest_nodes
from fleetbench.registry.capacity.rules import NodeOffer, Plan, fewest_nodes, plans_per_class
from fleetbench.registry.hardware import UNKNOWN_CLASS
from fleetbench.registry.models import Model
from fleetbench.registry.placement.answer import EVERY_NODE, place
from fleetbench.registry.placement.rules import PlacementQuestion
from fleetbench.registry.state import Bounded

__all__ = ["plan_capacity"]


def _refusal(
    candidate: PlacementCandidate, stale_before: datetime, reserved: Collection[str]
) -> str | None:
    """Why a candidate's curve should not be planned on, or None."""
    if candidate.node in reserved:
        return "reserved"
    if candidate.measured_at < stale_before:
        return f"stale: measured {candidate.measured_at:%Y-%m-%d}"
    if candidate.past_knee:
        return f"B={candidate.concurrency} lies past its knee: more users cost each one speed"
    if candidate.engine_on_accelerator is False:
        return "off accelerator: its run measured the CPU of a node with a GPU"
    blind = candidate.min_detectable_change_pct
    if blind is not None and blind > BLIND_ABOVE_PCT:
        return f"blind series: a slowdown under {blind:.0f}% would go unseen on it"
    return None


def plan_capacity(
    session: Session,
    models: Sequence[Model],
    question: PlacementQuestion,
    *,
    users: int,
    reserve: Collection[str] = (),
    minimise: CapacityMinimise = "nodes",
    stale_after_hours: float,
    classes: Bounded[uuid.UUID, str],
) -> CapacityAnswer:
    """The fewest nodes serving `users` users, or the cheapest an hour, each as placement's
    `question` asks (every candidate considered, whatever its `limit`), leaving out the
    `reserve`d nodes (and, for the cheapest, those whose class has no price)."""
    question = dataclasses.replace(question, limit=EVERY_NODE)
    placed = place(session, models, question, classes=classes)
    now = datetime.now(UTC)
    stale_before = now - timedelta(hours=stale_after_hours)
    refused: list[CapacityRefusal] = []
    usable: list[PlacementCandidate] = []
    for candidate in placed.candidates:
        why = _refusal(candidate, stale_before, reserve)
        if why is None:
            usable.append(candidate)
        else:
            refused.append(CapacityRefusal(node=candidate.node, reason=why))
    offered = {c.node for c in placed.candidates}
    refused += [
        CapacityRefusal(node=r.node, reason=f"no user fits: {r.reason}")
        for r in placed.rejected
        if r.node not in offered and r.node not in reserve
    ]
    offers = [
        NodeOffer(
            c.node, c.hardware_class or UNKNOWN_CLASS, c.concurrency, c.total_tps, c.usd_per_hour
        )
        for c in usable
    ]
    by_node = {c.node: c for c in usable}
    cheapest: CheapestPlan | None = None
    unpriced: list[NodeOffer] = []
    if minimise == "cost":
        cheapest = cheapest_nodes(offers, users)
        plan = cheapest.plan
        unpriced = [o for o in offers if o.usd_per_hour is None]
        refused += [CapacityRefusal(node=o.node, reason=_unpriced(o)) for o in unpriced]
    else:
        plan = fewest_nodes(offers, users)
    per_class = plans_per_class(offers, users)
    return CapacityAnswer(
        model=placed.model,
        users=users,
        min_tps_per_user=question.min_tps_per_user,
        context_tokens=question.context_tokens,
        max_ttft_ms=question.max_ttft_ms,
        kind=question.kind,
        minimise=minimise,
        enough=plan.enough,
        nodes_needed=len(plan.nodes) if plan.enough else None,
        plan=[_node(by_node[o.node], o, now) for o in plan.nodes],
        users_served=plan.users_served,
        headroom_users=plan.headroom,
        total_tps=plan.total_tps,
        usd_per_hour=plan.usd_per_hour,
        usd_per_million_tokens=plan.usd_per_million_tokens,
        exact=None if cheapest is None else cheapest.exact,
        lower_bound_usd_per_hour=None if cheapest is None else cheapest.lower_bound_usd_per_hour,
        per_class=[_class(name, found, offers) for name, found in per_class.items()],
        refused=sorted(refused, key=lambda r: r.node),
        reason=_reason(plan, cheapest, len(offers) - len(unpriced), len(refused)),
    )


def _unpriced(offer: NodeOffer) -> str:
    """Why a cost plan leaves a node out, and what would price it."""
    named = offer.hardware_class
    if named == UNKNOWN_CLASS:
        return "no price: its run names no hardware class to price"
    return (
        f"no price for its class {named}: "
        f'fleetbench-registry price set "{named}" USD_PER_HOUR (or PUT /v1/prices)'
    )


def _node(candidate: PlacementCandidate, offer: NodeOffer, now: datetime) -> CapacityNode:
    return CapacityNode(
        node=candidate.node,
        hardware_class=offer.hardware_class,
        users=offer.users,
        per_user_tps=candidate.per_user_tps,
        total_tps=candidate.total_tps,
        source=candidate.source,
        llama_cpp_build=candidate.llama_cpp_build,
        measured_at=candidate.measured_at,
        age_days=(now - candidate.measured_at).total_seconds() / 86400,
        run_id=candidate.run_id,
        usd_per_hour=offer.usd_per_hour,
    )


def _class(name: str, plan: Plan, offers: Sequence[NodeOffer]) -> CapacityClass:
    return CapacityClass(
        hardware_class=name,
        nodes_available=sum(1 for o in offers if o.hardware_class == name),
        nodes_needed=len(plan.nodes) if plan.enough else None,
        users_served=plan.users_served,
        total_tps=plan.total_tps,
        usd_per_hour=plan.usd_per_hour if plan.enough else None,
        usd_per_million_tokens=plan.usd_per_million_tokens if plan.enough else None,
    )


def _reason(plan: Plan, cheapest: CheapestPlan | None, eligible: int, refused: int) -> str:
    left_out = f"; {refused} node{'s' if refused != 1 else ''} left out (see refused)"
    if not plan.enough:
        priced = "" if cheapest is None else "priced "
        return (
            f"not enough: the {eligible} eligible {priced}node{'s' if eligible != 1 else ''} "
            f"serve {plan.users_served} of {plan.users} users" + (left_out if refused else "")
        )
    nodes = "1 node serves" if len(plan.nodes) == 1 else f"{len(plan.nodes)} nodes serve"
    said = f"{nodes} {plan.users} users with room for {plan.headroom} more"
    if plan.usd_per_hour is not None:
        said += f" for ${plan.usd_per_hour:,.2f}/h"
    if plan.usd_per_million_tokens is not None:
        said += f" (${plan.usd_per_million_tokens:,.2f} per million tokens)"
    if cheapest is not None:
        said = ("the cheapest: " if cheapest.exact else "planned greedily: ") + said
        if not cheapest.exact and (saved := cheapest.most_saved_usd_per_hour) is not None:
            said += f", at most ${saved:,.2f}/h above the cheapest possible"
    return said + (left_out if refused else "")
