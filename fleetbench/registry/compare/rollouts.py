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
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleetbench.contract.answers import CompareVerdict
from fleetbench.contract.bounds import Name
from fleetbench.registry import crud
from fleetbench.registry.compare.answer import CompareKind, compare_builds
from fleetbench.registry.compare.rows import select_builds
from fleetbench.registry.compare.rules import CompareSettings
from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import RUN_SERVED, RUN_SUCCESSFUL, Model, RolloutWatch, Run

log = logging.getLogger("fleetbench.registry.compare.rollouts")

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

    @model_validator(mode="after")
    def _two_builds(self) -> RolloutRequest:
        if self.from_build == self.to_build:
            raise ValueError("from_build and to_build name the same build: nothing to compare")
        return self


class RolloutPublic(BaseModel):
    id: int
    model: str
    from_build: str
    to_build: str
    kind: CompareKind
    verdict: CompareVerdict = Field(description="as last checked")
    reason: str
    previous_verdict: CompareVerdict | None = Field(description="before the last change")
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
    """The dashboard's compare page of the watched comparison."""
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
    (False). The first verdict is no event: the admin who asked reads it in the answer.
    The model is kept by its name as stored, however the request spelt it (any case, with
    `.gguf`, its sha256): one watch for one model."""
    key = request.model_dump() | {"model": models[0].name}
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
        session.rollback()
        theirs = session.scalars(select(RolloutWatch).filter_by(**key)).one_or_none()
        if theirs is None:  # made and forgotten again meanwhile: ask again
            raise
        return theirs, False
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


# Ingest stamps a run's received_at when its transaction starts, and another process's
# clock may run behind ours: runs received this long before a check are looked at again.
RECEIVED_GRACE = timedelta(minutes=2)


def _has_runs_since(
    session: Session, models: Sequence[Model], watch: RolloutWatch, since: datetime
) -> bool:
    """Whether runs that the watch compares (its builds, its kind) were received since."""
    builds = select_builds(session, watch.from_build, watch.to_build)
    newer = select(Run.id).where(
        Run.model_id.in_([m.id for m in models]),
        Run.build_id.in_([*builds.before_ids, *builds.after_ids]),
        RUN_SERVED if watch.kind == "serving" else RUN_SUCCESSFUL,
        Run.received_at > since - RECEIVED_GRACE,
    )
    return bool(session.scalar(select(exists(newer))))


def check_rollouts(
    session: Session, settings: CompareSettings, *, stop: threading.Event | None = None
) -> int:
    """Each watch with runs of its builds received since its last check, checked again;
    returns how many verdicts changed (each now an event waiting for the webhook). A watch
    that cannot be checked is logged and left for the next pass: the others go on. `stop`
    set: the watches not yet checked wait for the next pass (the registry is stopping)."""
    changed = 0
    for watch_id in session.scalars(select(RolloutWatch.id).order_by(RolloutWatch.id)).all():
        if stop is not None and stop.is_set():
            break
        try:
            changed += _check(session, watch_id, settings)
        except Exception:
            session.rollback()
            log.exception("the watched rollout %s could not be checked", watch_id)
    return changed


def _check(session: Session, watch_id: int, settings: CompareSettings) -> bool:
    """Whether this check changed the watch's verdict (and recorded it: of registry
    processes checking it at once, one records it, and never over a later check's)."""
    session.commit()  # each watch read in a snapshot of its own, taken from here
    started = datetime.now(UTC)  # runs received from here on bring another check
    watch = session.get(RolloutWatch, watch_id, populate_existing=True)
    if watch is None:  # forgotten meanwhile
        return False
    models = crud.find_models(session, watch.model)
    if not models or not _has_runs_since(session, models, watch, watch.checked_at):
        return False
    verdict, reason = _verdict(session, models, watch, settings)
    was, last_checked = watch.verdict, watch.checked_at
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
    with write_transaction(session):
        recorded = session.execute(
            update(RolloutWatch)
            .where(
                RolloutWatch.id == watch_id,
                RolloutWatch.verdict == was,
                RolloutWatch.checked_at == last_checked,
            )
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        session.commit()
    return verdict != was and recorded.rowcount == 1  # type: ignore[attr-defined]
