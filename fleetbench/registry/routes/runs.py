from __future__ import annotations

import time
import uuid
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from fleetbench.contract.answers import RunReceipt
from fleetbench.contract.wire import RunReport
from fleetbench.registry import crud, export
from fleetbench.registry.deps import NodeAuth, ReadAccess, SessionDep
from fleetbench.registry.metrics import MetricsDep
from fleetbench.registry.params import INT32_MAX, ModelQuery, NodeQuery, SinceQuery
from fleetbench.registry.responses import BAD_BODY, NOT_FOUND, TOO_LARGE, refused
from fleetbench.registry.schemas import RunDetail, RunsPublic, run_detail, run_public

router = APIRouter(prefix="/runs", tags=["runs"])
ingest_router = APIRouter(prefix="/runs", tags=["runs"])


@ingest_router.post(
    "",
    response_model=RunReceipt,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": RunReceipt, "description": "already stored (a retry)"},
        403: {"description": "the token belongs to another node"},
        409: {"description": "this node's run id was stored with a different report"},
        **refused("over this registry's bounds (FLEETBENCH_MAX_POINTS_PER_REPORT, ...)"),
        **BAD_BODY,
        **TOO_LARGE,
    },
)
async def ingest_run(
    report: RunReport,
    node: NodeAuth,
    request: Request,
    response: Response,
    metrics: MetricsDep,
) -> RunReceipt:
    """Store one sweep run; retrying with the same run id and body is always safe. Run ids
    are the node's own: another node's run with the same id is stored beside it, under an
    id of its own (`stored_as`). The rules the schema cannot state are in RunReport's
    description."""
    begun = time.perf_counter()
    if report.node != node.name:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"this token belongs to node {node.name!r}, the report is for {report.node!r}",
        )
    stored = await request.app.state.ingest.submit(report, node_id=node.id)
    metrics.ingested(report, created=stored.created, seconds=time.perf_counter() - begun)
    if not stored.created:
        response.status_code = status.HTTP_200_OK
    return RunReceipt(
        run_id=report.run_id,
        stored_as=stored.run_id,
        outcome="created" if stored.created else "already stored",
        points=len(report.points),
        failures=len(report.failures),
        ignored_fields=report.ignored_fields,
    )


@router.get("", response_model=RunsPublic, dependencies=[ReadAccess])
def read_runs(
    session: SessionDep,
    node: NodeQuery | None = None,
    model: ModelQuery | None = None,
    since: SinceQuery | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> RunsPublic:
    """Runs newest first, filtered by node, model and start time, paginated."""
    runs, count = crud.list_runs(
        session, node=node, model=model, since=since, limit=limit, offset=offset
    )
    return RunsPublic(data=[run_public(r) for r in runs], count=count)


@router.get("/{run_id}", response_model=RunDetail, dependencies=[ReadAccess], responses=NOT_FOUND)
def read_run(run_id: uuid.UUID, session: SessionDep) -> RunDetail:
    """One run with its measured and failed points."""
    run = crud.get_run(session, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="run not found")
    return run_detail(run)


@router.get(
    "/{run_id}/export",
    dependencies=[ReadAccess],
    response_class=Response,
    responses={
        200: {"content": {"text/csv": {}, "application/json": {}}, "description": "a download"},
        409: {"description": "a serving run, which is not exported yet"},
        **NOT_FOUND,
    },
)
def export_run(
    run_id: uuid.UUID, session: SessionDep, format: export.ExportFormat = "csv"
) -> Response:
    """One run's measured and failed points as CSV or a JSON array, one row per point
    (registry/export.py says the columns)."""
    run = crud.get_run(session, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="run not found")
    if run.kind != "offline":  # its columns are the batched-bench table's
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail="a serving run is not exported yet: GET /v1/runs/{id} gives its points",
        )
    return export.run_export_response(run, format)
