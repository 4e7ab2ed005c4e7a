"""A node's history: regressions, batching curves with their knee, one series over time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from fleetbench.registry.curves.answer import curves_answer
from fleetbench.registry.curves.knee import KNEE_THRESHOLD
from fleetbench.registry.db import write_transaction
from fleetbench.registry.deps import (
    AdminAuth,
    ProcessDep,
    ReadAccess,
    SessionDep,
    models_or_404,
    node_or_404,
)
from fleetbench.registry.export import export_response
from fleetbench.registry.models import Model, Node
from fleetbench.registry.params import INT32_MAX, ModelQuery, NodeQuery, SinceQuery
from fleetbench.registry.regressions import series
from fleetbench.registry.regressions import store as regression_store
from fleetbench.registry.regressions.rules import describe_cause, min_detectable_change
from fleetbench.registry.responses import BAD_BODY, NOT_FOUND, TOO_LARGE
from fleetbench.registry.schemas import (
    Acknowledgement,
    CurvesPublic,
    RegressionPublic,
    RegressionsPublic,
    SeriesKey,
    SeriesPointPublic,
    SeriesPublic,
    regression_public,
)

router = APIRouter(tags=["questions"])

Count = Annotated[int, Query(ge=0, le=INT32_MAX)]


def _node_and_models(session: SessionDep, node: str, model: str) -> tuple[Node, Sequence[Model]]:
    return node_or_404(session, node), models_or_404(session, model)


@router.get(
    "/regressions", response_model=RegressionsPublic, dependencies=[ReadAccess], responses=NOT_FOUND
)
def read_regressions(
    session: SessionDep,
    since: Annotated[SinceQuery | None, Query(description="first seen at or after")] = None,
    node: NodeQuery | None = None,
    model: ModelQuery | None = None,
    min_change: Annotated[
        float | None,
        Query(ge=0, le=1e9, allow_inf_nan=False, description="least |change|, percent"),
    ] = None,
    include_improvements: bool = False,
    include_acknowledged: bool = False,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> RegressionsPublic:
    """Series that got slower (or faster) and stayed so, newest first, with the cause. A node
    or model the registry does not know is a 404, not an empty list (a gate must not pass on
    a misspelt name)."""
    node_id = node_or_404(session, node).id if node is not None else None
    model_ids = [m.id for m in models_or_404(session, model)] if model is not None else None
    rows, count = regression_store.list_regressions(
        session,
        node_id=node_id,
        model_ids=model_ids,
        since=since,
        min_change=min_change / 100 if min_change is not None else None,
        include_improvements=include_improvements,
        include_acknowledged=include_acknowledged,
        limit=limit,
    )
    return RegressionsPublic(data=[regression_public(r) for r in rows], count=count)


@router.post(
    "/regressions/{regression_id}/acknowledge",
    response_model=RegressionPublic,
    responses={
        **NOT_FOUND,
        **BAD_BODY,
        **TOO_LARGE,
    },
)
def acknowledge(
    regression_id: Annotated[int, Path(ge=1, le=INT32_MAX)],
    body: Acknowledgement,
    session: SessionDep,
    admin: AdminAuth,
) -> RegressionPublic:
    """Accepts a regression (with a note), with an admin token (the node that regressed
    cannot silence itself): it is no longer listed by default nor makes its node's health
    'regressed'; who accepted it and when is kept."""
    with write_transaction(session):
        row = regression_store.get_regression(session, regression_id)
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail="regression not found")
        regression_store.acknowledge_regression(row, note=body.note, by=admin.name)
        public = regression_public(row)
        session.commit()
    return public


@router.get("/curves", response_model=CurvesPublic, dependencies=[ReadAccess], responses=NOT_FOUND)
def read_curves(
    session: SessionDep,
    process: ProcessDep,
    node: NodeQuery,
    model: ModelQuery,
    knee_threshold: Annotated[
        float, Query(gt=0, le=1, description="share of S_TG(1) an added stream must add")
    ] = KNEE_THRESHOLD,
) -> Response:
    """The node's batching curves for the model, one per build, each with its knee."""
    found_node, models = _node_and_models(session, node, model)
    answer = curves_answer(
        session,
        found_node,
        models,
        knee_threshold=knee_threshold,
        classes=process.hardware_classes,
    )
    # Serialized here: FastAPI would validate and dump the answer a second time.
    return Response(answer.model_dump_json(), media_type="application/json")


@router.get(
    "/series",
    response_model=SeriesPublic,
    dependencies=[ReadAccess],
    responses={**NOT_FOUND, 200: {"content": {"text/csv": {}}}},
)
def read_series(
    session: SessionDep,
    node: NodeQuery,
    model: ModelQuery,
    pp: Count,
    tg: Count,
    b: Annotated[int, Query(ge=1, le=INT32_MAX)],
    metric: series.Metric = "s_tg",
    limit: Annotated[int, Query(ge=1, le=100_000, description="latest runs")] = 1000,
    format: Literal["json", "csv"] = "json",
) -> SeriesPublic | Response:
    """One series over time (oldest first), what changed between runs, and its steps."""
    found_node, models = _node_and_models(session, node, model)
    runs = series.series(
        session,
        node_id=found_node.id,
        model_ids=[m.id for m in models],
        pp=pp,
        tg=tg,
        b=b,
        metric=metric,
        limit=limit,
    )
    points = [
        SeriesPointPublic(
            run_id=run.run_id,
            started_at=run.started_at,
            value=run.value,
            build=run.build,
            binding=run.binding,
            fingerprint=run.hardware,
            change=(
                describe_cause(kinds, previous, run)
                if previous is not None and (kinds := run.changes_from(previous))
                else None
            ),
        )
        for previous, run in zip([None, *runs], runs, strict=False)
    ]
    rows, _ = regression_store.list_regressions(
        session,
        node_id=found_node.id,
        model_ids=[m.id for m in models],
        include_improvements=True,
        include_acknowledged=True,
        series=(pp, tg, b, metric),
    )
    answer = SeriesPublic(
        node=found_node.name,
        model=models[0].name,
        pp=pp,
        tg=tg,
        b=b,
        metric=metric,
        points=points,
        regressions=[regression_public(r) for r in rows],
        min_detectable_change_pct=(
            round(100 * change, 3)
            if (change := min_detectable_change(runs[-series.HISTORY_RUNS :])) is not None
            else None
        ),
    )
    if format == "csv":
        return _series_csv(answer)
    return answer


_SERIES_COLUMNS = (*SeriesKey.model_fields, *SeriesPointPublic.model_fields)


def _series_csv(answer: SeriesPublic) -> Response:
    fixed = answer.model_dump(include=set(SeriesKey.model_fields))
    rows = [{**fixed, **point.model_dump()} for point in answer.points]
    name = f"{answer.node}-{answer.model}-pp{answer.pp}-tg{answer.tg}-b{answer.b}-{answer.metric}"
    return export_response(rows, columns=_SERIES_COLUMNS, format="csv", filename=name)
