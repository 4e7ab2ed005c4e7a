"""Rollouts: two builds of llama.cpp compared across the fleet, with a verdict."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from fleetbench.contract.bounds import NAME_LENGTH, WITHOUT_NUL
from fleetbench.registry.compare.answer import CompareAnswer, CompareKind, compare_builds
from fleetbench.registry.deps import (
    ProcessDep,
    ReadAccess,
    SessionDep,
    SettingsDep,
    models_or_404,
)
from fleetbench.registry.params import MAX_AGE_DAYS, ModelQuery
from fleetbench.registry.responses import NOT_FOUND

router = APIRouter(tags=["questions"], dependencies=[ReadAccess])

_BUILD_HELP = (
    "a build number (b4567), a commit (7 hex digits or more), a binding's version (0.3.16: "
    "in-process runs) or a whole build label"
)
BuildQuery = Annotated[
    str, Query(min_length=1, max_length=NAME_LENGTH, pattern=WITHOUT_NUL, description=_BUILD_HELP)
]


@router.get("/compare", response_model=CompareAnswer, responses=NOT_FOUND)
def read_compare(
    session: SessionDep,
    settings: SettingsDep,
    process: ProcessDep,
    model: ModelQuery,
    from_build: BuildQuery,
    to_build: BuildQuery,
    kind: Annotated[
        CompareKind,
        Query(description="offline curves (S_TG, S_PP) or serving runs (TTFT p90, per-user p10)"),
    ] = "offline",
    max_age_days: Annotated[float | None, Query(gt=0, le=MAX_AGE_DAYS, allow_inf_nan=False)] = None,
    limit: Annotated[
        int, Query(ge=1, le=100_000, description="list at most this many nodes, worst first")
    ] = 100,
) -> Response:
    """Is `to_build` safe to roll out after `from_build`? Every node that ran both on the
    same hardware and settings, compared point by point, and a verdict per hardware class:
    go, hold (which class, where, how much) or unknown (how many more runs)."""
    answer = compare_builds(
        session,
        models_or_404(session, model),
        from_build=from_build,
        to_build=to_build,
        kind=kind,
        max_age_days=max_age_days,
        settings=settings.compare_settings(),
        limit=limit,
        answers=process.compare_answers,
    )
    return Response(answer.model_dump_json(), media_type="application/json")
