"""Watched rollouts: an admin names a model and two builds (as GET /v1/compare does), the
registry keeps their verdict and checks it again whenever the model has new runs; a
change of verdict (unknown -> go, go -> hold, ...) is a webhook event (registry.notify),
so a team hears when its canaries have said enough, without asking again and again.

The verdict is GET /v1/compare's, computed the same way (registry.compare). Several
registry processes may check the same watch at once: a change is recorded only where the
stored verdict is still the one the check started from, so it is announced once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleetbench.contract.bounds import Name
from fleetbench.registry import crud
from fleetbench.registry.compare import CompareKind, compare_builds
from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import Model, RolloutWatch, Run
from fleetbench.registry.questions.compare import CompareSettings, Verdict

log = logging.getLogger("fleetbench.registry.rollouts")

__all__ = [
    "RolloutPublic",
    "RolloutRequest",
    "RolloutsPublic",
    "check_rollouts",
    "forget_rollout",
    "rollout_link",
    "rollout_public",
    "watch_rollout",
    "watched_rollouts",
]


class RolloutRequest(BaseModel):
    """A rollout to watch: the builds named as GET /v1/compare names them."""

    model_config = ConfigDict(extra="forbid")

    model: Name
    from_build: Name = Field(description="the build the fleet runs now")
    to_build: Name = Field(description="the build being rolled out")
    kind: CompareKind = "offline"


class RolloutPublic(BaseModel):
    id: int
    model: str
    from_build: str
    to_build: str
    kind: CompareKind
    verdict: Verdict = Field(description="as last checked")
    reason: str
    previous_verdict: Verdict | None = Field(description="before the last change")
    checked_at: datetime = Field(description="when the verdict was last computed")
    changed_at: datetime | None = Field(description="when the verdict last changed")
    notified_at: datetime | None = Field(description="when the webhook took that change")
    created_at: datetime
    created_by: str | None


class RolloutsPublic(BaseModel):
    data: list[RolloutPublic]
    count: int


def rollout_public(watch: RolloutWatch) -> RolloutPublic:
    return RolloutPublic.model_validate(watch, from_attributes=True)


def rollout_link(public_url: str, watch: RolloutPublic) -> str:
    """The dashboard's Rollouts page for the watched comparison."""
    query = urlencode(watch.model_dump(include={"model", "from_build", "to_build", "kind"}))
    return f"{public_url.rstrip('/')}/compare?{query}"


def _verdict(
    session: Session, models: Sequence[Model], watch: RolloutWatch, settings: CompareSettings
) -> tuple[str, str]:
    answer = compare_builds(
        session,
        models,
        from_build=watch.from_build,
        to_build=watch.to_build,
        kind="serving" if watch.kind == "serving" else "offline",
        max_age_days=None,
        settings=settings,
        limit=1,  # the verdict weighs every node whatever the listing's length
    )
    return answer.verdict, answer.reason


def watch_rollout(
    session: Session,
    request: RolloutRequest,
    models: Sequence[Model],
    *,
    by: str | None,
    settings: CompareSettings,
) -> tuple[RolloutWatch, bool]:
    """The watch of this comparison, made now with its first verdict (True) or as it was
    (False). The first verdict is no event: the admin who asked reads it in the answer."""
    key = request.model_dump()
    found = session.scalars(select(RolloutWatch).filter_by(**key)).one_or_none()
    if found is not None:
        return found, False
    now = datetime.now(UTC)
    watch = RolloutWatch(**key, created_at=now, created_by=by, checked_at=now)
    watch.verdict, watch.reason = _verdict(session, models, watch, settings)
    try:
        with write_transaction(session):
            session.add(watch)
            session.commit()
    except IntegrityError:  # another admin made the same watch meanwhile: theirs stands
        return session.scalars(select(RolloutWatch).filter_by(**key)).one(), False
    return watch, True


def watched_rollouts(session: Session) -> list[RolloutWatch]:
    return list(session.scalars(select(RolloutWatch).order_by(RolloutWatch.id)))


def forget_rollout(session: Session, rollout_id: int) -> bool:
    with write_transaction(session):
        watch = session.get(RolloutWatch, rollout_id)
        if watch is None:
            return False
        session.delete(watch)
        session.commit()
    return True


def _has_runs_since(session: Session, models: Sequence[Model], since: datetime) -> bool:
    newer = select(Run.id).where(Run.model_id.in_([m.id for m in models]), Run.received_at > since)
    return bool(session.scalar(select(exists(newer))))


def check_rollouts(session: Session, settings: CompareSettings) -> int:
    """Each watch whose model has runs received since its last check, checked again;
    returns how many verdicts changed (each now an event waiting for the webhook). A watch
    that cannot be checked is logged and left for the next pass: the others go on."""
    changed = 0
    for watch in watched_rollouts(session):
        try:
            changed += _check(session, watch, settings)
        except Exception:
            session.rollback()
            log.exception("the watched rollout %s could not be checked", watch.id)
    return changed


def _check(session: Session, watch: RolloutWatch, settings: CompareSettings) -> bool:
    """Whether this check changed the watch's verdict (and recorded it: another registry
    process checking it at the same moment records it once)."""
    models = crud.find_models(session, watch.model)
    if not models or not _has_runs_since(session, models, watch.checked_at):
        return False
    started = datetime.now(UTC)  # runs received from here on bring another check
    verdict, reason = _verdict(session, models, watch, settings)
    was = watch.verdict
    values: dict[str, object] = {"checked_at": started, "verdict": verdict, "reason": reason}
    if verdict != was:
        values |= {
            "previous_verdict": was,
            "changed_at": started,
            "notified_at": None,
            "notify_after": None,
            "notify_attempts": 0,
            "notify_error": None,
        }
    watch_id = watch.id
    with write_transaction(session):
        recorded = session.execute(
            update(RolloutWatch)
            .where(RolloutWatch.id == watch_id, RolloutWatch.verdict == was)
            .values(**values)
        )
        session.commit()
    return verdict != was and recorded.rowcount == 1  # type: ignore[attr-defined]
