from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.exceptions import RequestValidationError

from fleetbench.contract.answers import PlacementAnswer, PlacementKind
from fleetbench.registry.deps import ReadAccess, SessionDep, models_or_404
from fleetbench.registry.params import MAX_AGE_DAYS, MAX_FIGURE, MAX_TOKENS, ModelQuery
from fleetbench.registry.placement import place
from fleetbench.registry.responses import NOT_FOUND

router = APIRouter(tags=["questions"], dependencies=[ReadAccess])


@router.get("/placement", response_model=PlacementAnswer, responses=NOT_FOUND)
def read_placement(
    session: SessionDep,
    model: ModelQuery,
    min_tps_per_user: Annotated[float, Query(ge=0, le=MAX_FIGURE, allow_inf_nan=False)],
    prompt_tokens: Annotated[int | None, Query(ge=0, le=MAX_TOKENS)] = None,
    context_tokens: Annotated[
        int | None,
        Query(ge=1, le=MAX_TOKENS, description="tokens each user's conversation holds"),
    ] = None,
    max_age_days: Annotated[float | None, Query(gt=0, le=MAX_AGE_DAYS, allow_inf_nan=False)] = None,
    limit: Annotated[
        int, Query(ge=1, le=100_000, description="list at most this many candidates")
    ] = 100,
    kind: Annotated[
        PlacementKind,
        Query(
            description="answer from offline curves, serving runs, or any: each node's "
            "serving run of the model where it has one, else its offline curve"
        ),
    ] = "any",
    max_ttft_ms: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_FIGURE,
            allow_inf_nan=False,
            description="the p90 time to first token each user may wait, ms (serving runs)",
        ),
    ] = None,
) -> Response:
    """Which node and concurrency meets `min_tps_per_user` decode tokens/s per user (on a
    serving run: the p10 of its users' speeds), within `max_ttft_ms` to the first token
    when given, and, given `context_tokens`, holds every user's KV cache beside the
    weights?"""
    if kind == "offline" and max_ttft_ms is not None:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("query", "max_ttft_ms"),
                    "msg": "offline curves have no time to first token: ask with kind "
                    "serving or any (serving runs measure it)",
                    "input": max_ttft_ms,
                }
            ]
        )
    answer = place(
        session,
        models_or_404(session, model),
        min_tps_per_user=min_tps_per_user,
        prompt_tokens=prompt_tokens,
        context_tokens=context_tokens,
        max_age_days=max_age_days,
        limit=limit,
        kind=kind,
        max_ttft_ms=max_ttft_ms,
    )
    # Serialized here: FastAPI would dump and validate the answer again, which costs more
    # than the query on a 1,000-node fleet.
    return Response(answer.model_dump_json(), media_type="application/json")
