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
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleetbench.contract.plans import NodePlans, NodeStatus, PlanBody, PlanVersion, plan_selects
from fleetbench.registry.models import Node, NodePlanStatus, SweepPlan

__all__ = [
    "PlanChanged",
    "SavedPlan",
    "current_plans",
    "node_plans",
    "plan_etag",
    "plan_history",
    "plan_version",
    "record_status",
    "request_sweep",
    "retire_plan",
    "save_plan",
]


class PlanChanged(Exception):
    """Another writer saved a version of the plan at the same moment."""


@dataclass(frozen=True)
class SavedPlan:
    plan: PlanVersion
    new_version: bool  # False: the body was the current version's already


def _now() -> datetime:
    return datetime.now(UTC)


def plan_version(row: SweepPlan) -> PlanVersion:
    """A stored version as the contract states it (not validated again: a version saved
    under older rules must stay readable)."""
    body = PlanBody.model_validate(row.body)
    return PlanVersion.model_construct(
        **dict(body),
        name=row.name,
        version=row.version,
        created_at=row.created_at,
        created_by=row.created_by,
    )


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
    plans = [plan_version(row) for row in rows]
    return [plan for plan in plans if plan.enabled] if enabled_only else plans


def plan_history(session: Session, name: str) -> list[PlanVersion]:
    """Every version of a plan, newest first (empty: no such plan)."""
    rows = session.scalars(
        select(SweepPlan).where(SweepPlan.name == name).order_by(SweepPlan.version.desc())
    ).all()
    return [plan_version(row) for row in rows]


def save_plan(session: Session, name: str, body: PlanBody, *, by: str | None) -> SavedPlan:
    """Saves `body` as the plan's next version, unless it is the current one already (then
    nothing is written: applying one file twice is harmless). Raises PlanChanged."""
    head = _head(session, name)
    stored = body.model_dump(mode="json")
    if head is not None and head.body == stored:
        return SavedPlan(plan_version(head), new_version=False)
    row = SweepPlan(
        name=name,
        version=head.version + 1 if head is not None else 1,
        body=stored,
        created_at=_now(),
        created_by=by,
    )
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
    """Saves a version of the plan that no node runs (None: no such plan)."""
    head = _head(session, name)
    if head is None:
        return None
    body = PlanBody.model_validate(head.body).model_copy(update={"enabled": False})
    return save_plan(session, name, body, by=by)


def _status_row(session: Session, node_id: int) -> NodePlanStatus:
    row = session.get(NodePlanStatus, node_id)
    if row is None:
        row = NodePlanStatus(node_id=node_id)
        session.add(row)
    return row


def node_plans(session: Session, node: Node) -> NodePlans:
    """The enabled plans that pick the node, and an admin's sweep-now request."""
    plans = [
        plan
        for plan in current_plans(session, enabled_only=True)
        if plan_selects(plan, node.name, node.labels)
    ]
    status = session.get(NodePlanStatus, node.id)
    requested = status.sweep_requested_at if status is not None else None
    return NodePlans(node=node.name, plans=plans, sweep_now=requested)


def plan_etag(plans: NodePlans) -> str:
    """The strong ETag of what a node pulls: the same plans give the same tag in every
    registry process, so a poll answers 304 whichever process it reaches."""
    return '"' + hashlib.sha256(plans.model_dump_json().encode()).hexdigest()[:32] + '"'


def request_sweep(session: Session, node_id: int) -> datetime:
    """Asks the node to run every plan of its at its next poll."""
    row = _status_row(session, node_id)
    row.sweep_requested_at = _now()
    return row.sweep_requested_at


def record_status(session: Session, node_id: int, status: NodeStatus) -> None:
    """Keeps what the node says; a sweep-now request it has run is cleared."""
    row = _status_row(session, node_id)
    row.reported_at = _now()
    row.status = status.model_dump(mode="json")
    row.next_run_at = status.next_run_at
    requested = row.sweep_requested_at
    if requested is not None and status.swept_now is not None and status.swept_now >= requested:
        row.sweep_requested_at = None
