"""The capacity answer: each node's placement candidate (registry.placement: its largest
concurrency meeting the speed, memory fit included) as the users it offers, the nodes
whose curves should not be planned on left out with the reason, and the fewest nodes
serving the users found by the pure planner (registry.capacity.rules)."""

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
    CapacityNode,
    CapacityRefusal,
    PlacementCandidate,
)
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
    stale_after_hours: float,
    classes: Bounded[uuid.UUID, str],
) -> CapacityAnswer:
    """The fewest nodes serving `users` users, each as placement's `question` asks (every
    candidate considered, whatever its `limit`), leaving out the `reserve`d nodes."""
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
        NodeOffer(c.node, c.hardware_class or UNKNOWN_CLASS, c.concurrency, c.total_tps)
        for c in usable
    ]
    by_node = {c.node: c for c in usable}
    plan = fewest_nodes(offers, users)
    per_class = plans_per_class(offers, users)
    return CapacityAnswer(
        model=placed.model,
        users=users,
        min_tps_per_user=question.min_tps_per_user,
        context_tokens=question.context_tokens,
        max_ttft_ms=question.max_ttft_ms,
        kind=question.kind,
        enough=plan.enough,
        nodes_needed=len(plan.nodes) if plan.enough else None,
        plan=[_node(by_node[o.node], o, now) for o in plan.nodes],
        users_served=plan.users_served,
        headroom_users=plan.headroom,
        total_tps=plan.total_tps,
        per_class=[_class(name, found, offers) for name, found in per_class.items()],
        refused=sorted(refused, key=lambda r: r.node),
        reason=_reason(plan, len(offers), len(refused)),
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
    )


def _class(name: str, plan: Plan, offers: Sequence[NodeOffer]) -> CapacityClass:
    return CapacityClass(
        hardware_class=name,
        nodes_available=sum(1 for o in offers if o.hardware_class == name),
        nodes_needed=len(plan.nodes) if plan.enough else None,
        users_served=plan.users_served,
        total_tps=plan.total_tps,
    )


def _reason(plan: Plan, eligible: int, refused: int) -> str:
    left_out = f"; {refused} node{'s' if refused != 1 else ''} left out (see refused)"
    if plan.enough:
        return (
            f"{len(plan.nodes)} node{'s' if len(plan.nodes) != 1 else ''} serve "
            f"{plan.users} users with room for {plan.headroom} more" + (left_out if refused else "")
        )
    return (
        f"not enough: the {eligible} eligible node{'s' if eligible != 1 else ''} serve "
        f"{plan.users_served} of {plan.users} users" + (left_out if refused else "")
    )
