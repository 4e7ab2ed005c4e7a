"""Watched rollouts (registry.compare.rollouts): admins name a comparison to watch, readers read its
verdict, and the webhook says when it changes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Response, status

from fleetbench.contract.bounds import INT32_MAX
from fleetbench.registry.compare import rollouts
from fleetbench.registry.compare.rollouts import RolloutPublic, RolloutRequest, RolloutsPublic
from fleetbench.registry.deps import AdminAuth, ReadAccess, SessionDep, SettingsDep, models_or_404
from fleetbench.registry.responses import BAD_BODY, NOT_FOUND

router = APIRouter(prefix="/rollouts", tags=["rollouts"])

RolloutId = Annotated[int, Path(ge=1, le=INT32_MAX)]


@router.get("", response_model=RolloutsPublic, dependencies=[ReadAccess])
def read_rollouts(session: SessionDep) -> RolloutsPublic:
    """Every watched rollout with its verdict as last checked (GET /v1/compare answers it
    afresh, with every node's figures)."""
    data = [rollouts.rollout_public(w) for w in rollouts.watched_rollouts(session)]
    return RolloutsPublic(data=data, count=len(data))


@router.post(
    "",
    response_model=RolloutPublic,
    responses={
        201: {"model": RolloutPublic, "description": "now watched, with its first verdict"},
        **NOT_FOUND,
        **BAD_BODY,
    },
)
def watch_rollout(
    body: RolloutRequest,
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminAuth,
    response: Response,
) -> RolloutPublic:
    """Watches the comparison of two builds of a model (201, with its verdict now), or
    answers 200 with the watch there already. Each change of its verdict afterwards is a
    webhook event (`rollout_verdict`)."""
    watch, made = rollouts.watch_rollout(
        session,
        body,
        models_or_404(session, body.model),
        by=admin.name,
        settings=settings.compare_settings(),
    )
    response.status_code = status.HTTP_201_CREATED if made else status.HTTP_200_OK
    return rollouts.rollout_public(watch)


@router.delete("/{rollout_id}", status_code=status.HTTP_204_NO_CONTENT, responses=NOT_FOUND)
def forget_rollout(rollout_id: RolloutId, session: SessionDep, _: AdminAuth) -> None:
    """Stops watching a rollout (an undelivered change of its verdict goes with it)."""
    if not rollouts.forget_rollout(session, rollout_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no rollout {rollout_id}")
