"""Sweep plans in the registry (fleetbench.contract.plans): admins save versions, nodes pull
the plans that pick them and say how they fare. Every change is a new version; a plan is
never deleted, only retired (a version with `enabled` false), so what a node ran is always
on record.

Several registry processes may save the same plan at once: the version is the next after
the highest, and the unique (name, version) key lets one of them win; the other is told so
(PlanChanged) and saves again on the new head.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleetbench.contract.plans import (
    KINDS,
    MAX_PLANS_PER_NODE,
    NodePlans,
    NodeStatus,
    PlanBody,
    PlanVersion,
    PlanVersions,
    plan_selects,
)
from fleetbench.registry.models import Node, NodePlanStatus, SweepPlan

__all__ = [
    "PlanChanged",
    "PlanRefused",
    "SavedPlan",
    "current_plans",
    "node_plans",
    "paths_hidden",
    "plan_etag",
    "plan_history",
    "plan_version",
    "record_status",
    "request_sweep",
    "retire_plan",
    "save_plan",
]

log = logging.getLogger("fleetbench.registry")


class PlanChanged(Exception):
    """Another writer saved a version of the plan at the same moment."""


class PlanRefused(ValueError):
    """A plan this registry could not take the runs of."""


@dataclass(frozen=True)
class SavedPlan:
    plan: PlanVersion
    new_version: bool  # False: the body was the current version's already


def _now() -> datetime:
    return datetime.now(UTC)


def plan_version(row: SweepPlan) -> PlanVersion:
    """A stored version as the contract states it. Raises ValidationError for one saved
    under rules that no longer hold (_readable leaves it out, saying so)."""
    body = PlanBody.model_validate(row.body)
    return PlanVersion.model_construct(
        **dict(body),
        name=row.name,
        version=row.version,
        created_at=row.created_at,
        created_by=row.created_by,
    )


def _readable(rows: Sequence[SweepPlan]) -> list[PlanVersion]:
    """The versions today's rules read; one they refuse is logged and left out, so that
    it never fails every node's poll."""
    versions = []
    for row in rows:
        try:
            versions.append(plan_version(row))
        except ValidationError as exc:
            log.error("plan %r version %d is left out: %s", row.name, row.version, exc)
    return versions


def _head(session: Session, name: str) -> SweepPlan | None:
    return session.scalars(
        select(SweepPlan).where(SweepPlan.name == name).order_by(SweepPlan.version.desc()).limit(1)
    ).first()


def current_plans(session: Session, *, enabled_only: bool = False) -> list[PlanVersion]:
    """Each plan's current version, by name."""
    newest = (
        select(SweepPlan.name, func.max(SweepPlan.version).label("version"))
        .group_by(SweepPlan.name)
        .subquery()
    )
    rows = session.scalars(
        select(SweepPlan)
        .join(newest, (newest.c.name == SweepPlan.name) & (newest.c.version == SweepPlan.version))
        .order_by(SweepPlan.name)
    ).all()
    plans = _readable(rows)
    return [plan for plan in plans if plan.enabled] if enabled_only else plans


def plan_history(session: Session, name: str) -> list[PlanVersion]:
    """Every version of a plan, newest first (empty: no such plan)."""
    rows = session.scalars(
        select(SweepPlan).where(SweepPlan.name == name).order_by(SweepPlan.version.desc())
    ).all()
    return _readable(rows)


def save_plan(
    session: Session, name: str, body: PlanBody, *, by: str | None, max_points: int
) -> SavedPlan:
    """Saves `body` as the plan's next version, unless it is the current one already (then
    nothing is written: applying one file twice is harmless). Raises PlanRefused for a
    grid of more than `max_points` points (the registry would refuse every run of it), or
    PlanChanged."""
    points = len(body.settings.grid()) if body.kind == "offline" else len(body.load().concurrency)
    if points > max_points:
        raise PlanRefused(
            f"the plan's grid has {points} points (npp x ntg x npl); this registry takes at "
            f"most {max_points} in one run (FLEETBENCH_MAX_POINTS_PER_REPORT)"
        )
    head = _head(session, name)
    stored = body.model_dump(mode="json")
    if head is not None and head.body == stored:
        return SavedPlan(plan_version(head), new_version=False)
    return _insert(session, name, head.version + 1 if head is not None else 1, stored, by)


def _insert(
    session: Session, name: str, version: int, body: dict[str, Any], by: str | None
) -> SavedPlan:
    row = SweepPlan(name=name, version=version, body=body, created_at=_now(), created_by=by)
    session.add(row)
    try:
        session.flush()
    except IntegrityError as exc:  # the transaction is lost: the caller's rolls back
        raise PlanChanged(
            f"plan {name!r} was changed at the same moment (version {row.version} exists now);"
            " read it and save again"
        ) from exc
    return SavedPlan(plan_version(row), new_version=True)


def retire_plan(session: Session, name: str, *, by: str | None) -> SavedPlan | None:
    """Saves a version of the plan that no node runs (None: no such plan; a plan retired
    already stays as it is). Raises PlanRefused or PlanChanged."""
    head = _head(session, name)
    if head is None:
        return None
    try:
        current = plan_version(head)
    except ValidationError as exc:  # no node runs it (_readable): there is nothing to stop
        raise PlanRefused(
            f"version {head.version} of plan {name!r} does not meet this registry's rules, "
            "so no node runs it; save a new version to change it"
        ) from exc
    if not current.enabled:
        return SavedPlan(current, new_version=False)
    return _insert(session, name, head.version + 1, {**head.body, "enabled": False}, by)


def node_plans(
    session: Session,
    node: Node,
    *,
    kinds: Collection[str] = KINDS,
) -> NodePlans:
    """The enabled plans of `kinds` (those the agent says it runs) that pick the node, and
    an admin's sweep-now request."""
    plans = [
        plan
        for plan in current_plans(session, enabled_only=True)
        if plan.kind in kinds and plan_selects(plan, node.name, node.labels)
    ]
    if len(plans) > MAX_PLANS_PER_NODE:
        log.error(
            "node %r is picked by %d plans: it gets the first %d",
            node.name,
            len(plans),
            MAX_PLANS_PER_NODE,
        )
        plans = plans[:MAX_PLANS_PER_NODE]
    status = session.get(NodePlanStatus, node.id)
    requested = status.sweep_requested_at if status is not None else None
    return NodePlans(node=node.name, plans=plans, sweep_now=requested)


def plan_etag(body: str) -> str:
    """The strong ETag of what a node pulls (its NodePlans as JSON): the same plans give the
    same tag in every registry process, so a poll answers 304 whichever process it reaches."""
    return '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'


def _upsert_status(session: Session, node_id: int, values: dict[str, Any]) -> None:
    """One statement, so that a node's first status and an admin's sweep-now arriving
    together (in two processes) both land."""
    dialect = session.get_bind().dialect.name
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert_for(NodePlanStatus).values(node_id=node_id, **values)
    session.execute(
        statement.on_conflict_do_update(index_elements=[NodePlanStatus.node_id], set_=values)
    )


def request_sweep(session: Session, node_id: int) -> datetime:
    """Asks the node to run every plan of its at its next poll."""
    now = _now()
    _upsert_status(session, node_id, {"sweep_requested_at": now})
    return now


def record_status(session: Session, node_id: int, status: NodeStatus) -> None:
    """Keeps what the node says; a sweep-now request it has run is cleared, one made since
    is kept."""
    values = {
        "reported_at": _now(),
        "status": status.model_dump(mode="json"),
        "next_run_at": status.next_run_at,
    }
    _upsert_status(session, node_id, values)
    if status.swept_now is not None:
        session.execute(
            update(NodePlanStatus)
            .where(
                NodePlanStatus.node_id == node_id,
                NodePlanStatus.sweep_requested_at <= status.swept_now,
            )
            .values(sweep_requested_at=None)
        )


def paths_hidden(versions: PlanVersions) -> dict[str, Any]:
    """The plans as JSON without what they say of the nodes' insides (model paths, search
    directories, binaries, server URLs): what anyone reading without a token is shown."""
    shown = versions.model_dump(mode="json")
    for plan in shown["data"]:
        plan["model"] |= {"path": None, "search_dirs": []}
        for name in ("binary", "url"):
            if name in plan:
                plan[name] = None
    return shown | {"paths_hidden": True}
