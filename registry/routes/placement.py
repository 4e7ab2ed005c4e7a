from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from agent.wire import PlacementAnswer, PlacementCandidate
from registry import crud
from registry.deps import ReadAccess, SessionDep
from registry.questions.placement import place

router = APIRouter(tags=["questions"], dependencies=[ReadAccess])


@router.get("/placement", response_model=PlacementAnswer, responses={404: {}})
def read_placement(
    session: SessionDep,
    model: Annotated[str, Query(min_length=1, description="display name or GGUF sha256")],
    min_tps_per_user: Annotated[float, Query(ge=0, allow_inf_nan=False)],
    prompt_tokens: Annotated[int | None, Query(ge=0)] = None,
    max_age_days: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
) -> PlacementAnswer:
    """Which node and concurrency meets `min_tps_per_user` decode tokens/s per user?"""
    models = crud.find_models(session, model)
    if not models:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"model {model!r} not found")
    since = datetime.now(UTC) - timedelta(days=max_age_days) if max_age_days else None
    points = crud.placement_points(session, model_ids=[m.id for m in models], since=since)
    answer = place(
        points, model=models[0].name, min_tps_per_user=min_tps_per_user, prompt_tokens=prompt_tokens
    )
    reason = answer.reason
    if since is not None and not points:
        reason = f"{reason} in the last {max_age_days:g} days"
    return PlacementAnswer(
        model=models[0].name,
        min_tps_per_user=min_tps_per_user,
        candidates=[PlacementCandidate.model_validate(c) for c in answer.candidates],
        reason=reason,
    )
