from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.exceptions import RequestValidationError

from fleetbench.contract.answers import (
    CapacityAnswer,
    CapacityMinimise,
    PlacementAnswer,
    PlacementKind,
    PlacementOrder,
)
from fleetbench.contract.bounds import NAME_LENGTH
from fleetbench.registry.capacity.answer import plan_capacity
from fleetbench.registry.deps import (
    ProcessDep,
    ReadAccess,
    SessionDep,
    SettingsDep,
    models_or_404,
)
from fleetbench.registry.params import MAX_AGE_DAYS, MAX_FIGURE, MAX_TOKENS, ModelQuery
from fleetbench.registry.placement.answer import place
from fleetbench.registry.placement.rules import PlacementQuestion
from fleetbench.registry.responses import NOT_FOUND

router = APIRouter(tags=["questions"], dependencies=[ReadAccess])

# Reserved nodes named in one question: 16 of the longest names still fit the 64 KiB an
# HTTP request line may take here (a longer one is refused 400 before any route sees it).
MOST_RESERVED = 16

MinTpsPerUser = Annotated[float, Query(ge=0, le=MAX_FIGURE, allow_inf_nan=False)]
ContextTokens = Annotated[
    int | None, Query(ge=1, le=MAX_TOKENS, description="tokens each user's conversation holds")
]
MaxAgeDays = Annotated[float | None, Query(gt=0, le=MAX_AGE_DAYS, allow_inf_nan=False)]
Kind = Annotated[
    PlacementKind,
    Query(
        description="answer from offline curves, serving runs, or any: each node's "
        "serving run of the model where it has one, else its offline curve"
    ),
]
MaxTtftMs = Annotated[
    float | None,
    Query(
        gt=0,
        le=MAX_FIGURE,
        allow_inf_nan=False,
        description="the p90 time to first token each user may wait, ms (serving runs)",
    ),
]


def _timed_kind(kind: PlacementKind, max_ttft_ms: float | None) -> None:
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


@router.get("/placement", response_model=PlacementAnswer, responses=NOT_FOUND)
def read_placement(
    session: SessionDep,
    process: ProcessDep,
    model: ModelQuery,
    min_tps_per_user: MinTpsPerUser,
    prompt_tokens: Annotated[int | None, Query(ge=0, le=MAX_TOKENS)] = None,
    context_tokens: ContextTokens = None,
    max_age_days: MaxAgeDays = None,
    limit: Annotated[
        int, Query(ge=1, le=100_000, description="list at most this many candidates")
    ] = 100,
    kind: Kind = "any",
    max_ttft_ms: MaxTtftMs = None,
    order: Annotated[
        PlacementOrder,
        Query(
            description="throughput: best total throughput first; cost: the cheapest per "
            "million tokens first, by each hardware class's price (GET /v1/prices)"
        ),
    ] = "throughput",
) -> Response:
    """Which node and concurrency meets `min_tps_per_user` decode tokens/s per user (on a
    serving run: the p10 of its users' speeds), within `max_ttft_ms` to the first token
    when given, and, given `context_tokens`, holds every user's KV cache beside the
    weights? Each candidate is priced where its hardware class has a price."""
    _timed_kind(kind, max_ttft_ms)
    question = PlacementQuestion(
        min_tps_per_user=min_tps_per_user,
        prompt_tokens=prompt_tokens,
        context_tokens=context_tokens,
        max_age_days=max_age_days,
        kind=kind,
        max_ttft_ms=max_ttft_ms,
        limit=limit,
        order=order,
    )
    models = models_or_404(session, model)
    answer = place(session, models, question, classes=process.hardware_classes)
    # Serialized here: FastAPI would dump and validate the answer again, which costs more
    # than the query on a 1,000-node fleet.
    return Response(answer.model_dump_json(), media_type="application/json")


@router.get("/capacity", response_model=CapacityAnswer, responses=NOT_FOUND)
def read_capacity(
    session: SessionDep,
    settings: SettingsDep,
    process: ProcessDep,
    model: ModelQuery,
    users: Annotated[int, Query(ge=1, le=10_000_000, description="concurrent users to serve")],
    min_tps_per_user: MinTpsPerUser,
    context_tokens: ContextTokens = None,
    max_ttft_ms: MaxTtftMs = None,
    kind: Kind = "any",
    max_age_days: MaxAgeDays = None,
    reserve: Annotated[
        list[Annotated[str, Query(max_length=NAME_LENGTH)]],
        Query(
            max_length=MOST_RESERVED,
            description="nodes already assigned: left out of the plan (at most "
            f"{MOST_RESERVED}: the whole question must fit a URL)",
        ),
    ] = [],  # noqa: B006 (FastAPI copies a query default)
    minimise: Annotated[
        CapacityMinimise,
        Query(
            description="nodes: the fewest nodes; cost: the cheapest an hour by each hardware "
            "class's price (GET /v1/prices), nodes without one left out"
        ),
    ] = "nodes",
) -> Response:
    """How many of which nodes serve `users` concurrent users, each at `min_tps_per_user`
    or more (within `max_ttft_ms`, holding `context_tokens` each), from each node's
    measured curve: the fewest nodes (or the cheapest an hour), how many of each hardware
    class alone would do and what they cost, and the nodes left out and why."""
    _timed_kind(kind, max_ttft_ms)
    question = PlacementQuestion(
        min_tps_per_user=min_tps_per_user,
        context_tokens=context_tokens,
        max_age_days=max_age_days,
        kind=kind,
        max_ttft_ms=max_ttft_ms,
    )
    answer = plan_capacity(
        session,
        models_or_404(session, model),
        question,
        users=users,
        reserve=set(reserve),
        minimise=minimise,
        stale_after_hours=settings.stale_after_hours,
        classes=process.hardware_classes,
    )
    return Response(answer.model_dump_json(), media_type="application/json")
