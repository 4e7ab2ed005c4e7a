from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from agent.wire import PlacementAnswer
from registry import crud
from registry.deps import ReadAccess, SessionDep
from registry.questions.placement import answer_placement

router = APIRouter(tags=["questions"], dependencies=[ReadAccess])


@router.get("/placement", response_model=PlacementAnswer, responses={404: {}})
def read_placement(
    session: SessionDep,
    model: Annotated[str, Query(min_length=1, description="display name or GGUF sha256")],
    min_tps_per_user: Annotated[float, Query(ge=0, allow_inf_nan=False)],
    prompt_tokens: Annotated[int | None, Query(ge=0)] = None,
    max_age_days: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
    limit: Annotated[
        int, Query(ge=1, le=100_000, description="list at most this many candidates")
    ] = 100,
) -> Response:
    """Which node and concurrency meets `min_tps_per_user` decode tokens/s per user?"""
    models = crud.find_models(session, model)
    if not models:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"model {model!r} not found")
    since = datetime.now(UTC) - timedelta(days=max_age_days) if max_age_days else None
    rows = crud.placement_rows(
        session,
        model_ids=[m.id for m in models],
        since=since,
        prompt_tokens=prompt_tokens,
        min_tps_per_user=min_tps_per_user,
        limit=limit,
    )
    answer = answer_placement(
        model=models[0].name,
        min_tps_per_user=min_tps_per_user,
        qualifying=rows.qualifying,
        qualifying_count=rows.qualifying_count,
        fastest=rows.fastest,
        prompt_tokens=prompt_tokens,
        longest_prompt=rows.longest_prompt,
        max_age_days=max_age_days,
    )
    # Serialized here: FastAPI would dump and validate the answer again, which costs more
    # than the query on a 1,000-node fleet.
    return Response(answer.model_dump_json(), media_type="application/json")
