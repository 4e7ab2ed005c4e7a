"""Sweep plans (registry.plans): admins write them, readers read them, and each node pulls
its own and says how it fares."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Path, Query, Response, status
from fastapi.responses import JSONResponse

from fleetbench.contract.bounds import NAME_LENGTH, WITHOUT_NUL, Name
from fleetbench.contract.plans import (
    KINDS,
    NodePlans,
    NodeStatus,
    PlanBody,
    PlanKind,
    PlanVersion,
    PlanVersions,
)
from fleetbench.registry import plans
from fleetbench.registry.db import write_transaction
from fleetbench.registry.deps import (
    AdminAuth,
    NodeAuth,
    PathsShown,
    ReadAccess,
    SessionDep,
    SettingsDep,
    node_or_404,
)
from fleetbench.registry.models import Node
from fleetbench.registry.params import NodePath
from fleetbench.registry.responses import BAD_BODY, NOT_FOUND, TOO_LARGE, refused

router = APIRouter(prefix="/plans", tags=["plans"])
# The token is checked before a body is read: a node's status costs a bad token nothing.
agent_router = APIRouter(prefix="/agent", tags=["agent"])

PlanName = Annotated[Name, Path(min_length=1, max_length=NAME_LENGTH, pattern=WITHOUT_NUL)]
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"description": "the plan was changed at the same moment: save again"}
}


def _versions(data: list[PlanVersion], shown: bool) -> PlanVersions | JSONResponse:
    versions = PlanVersions(data=data, count=len(data))
    return versions if shown else JSONResponse(plans.paths_hidden(versions))


@router.get("", response_model=PlanVersions, dependencies=[ReadAccess])
def read_plans(session: SessionDep, shown: PathsShown) -> PlanVersions | JSONResponse:
    """Every plan's current version (retired ones too, with `enabled` false). Model paths,
    binaries and server URLs only to a reader or admin token (`paths_hidden`)."""
    return _versions(plans.current_plans(session), shown)


@router.get(
    "/{name}/versions", response_model=PlanVersions, dependencies=[ReadAccess], responses=NOT_FOUND
)
def read_plan_versions(
    name: PlanName, session: SessionDep, shown: PathsShown
) -> PlanVersions | JSONResponse:
    """Every version of one plan, newest first (paths as `GET /v1/plans` shows them)."""
    history = plans.plan_history(session, name)
    if not history:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no plan {name!r}")
    return _versions(history, shown)


@router.put(
    "/{name}",
    response_model=PlanVersion,
    responses={
        201: {"model": PlanVersion, "description": "a new version was saved"},
        **refused("a plan whose runs this registry would refuse"),
        **CONFLICT,
        **BAD_BODY,
        **TOO_LARGE,
    },
)
def save_plan(
    name: PlanName,
    body: PlanBody,
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminAuth,
    response: Response,
) -> PlanVersion:
    """Saves the plan as its next version (201), or answers 200 with the current one when
    the body is that already. Agents pick it up at their next poll."""
    with write_transaction(session):
        saved = plans.save_plan(
            session, name, body, by=admin.name, max_points=settings.max_points_per_report
        )
        session.commit()
    response.status_code = status.HTTP_201_CREATED if saved.new_version else status.HTTP_200_OK
    return saved.plan


@router.delete(
    "/{name}",
    response_model=PlanVersion,
    responses={
        **NOT_FOUND,
        **CONFLICT,
        **refused("its current version does not meet this registry's rules"),
    },
)
def retire_plan(name: PlanName, session: SessionDep, admin: AdminAuth) -> PlanVersion:
    """Retires the plan: a version no node runs (every version stays on record)."""
    with write_transaction(session):
        saved = plans.retire_plan(session, name, by=admin.name)
        if saved is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no plan {name!r}")
        session.commit()
    return saved.plan


@router.post(
    "/sweep-now/{name:path}",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=NodePlans,
    responses=NOT_FOUND,
)
def sweep_now(name: NodePath, session: SessionDep, _: AdminAuth) -> NodePlans:
    """Asks a node to run every plan of its now: it does at its next poll, and says so."""
    with write_transaction(session):
        found = node_or_404(session, name)
        plans.request_sweep(session, found.id)
        answer = plans.node_plans(session, found)
        session.commit()
    return answer


@agent_router.get(
    "/plans",
    response_model=NodePlans,
    responses={
        304: {"description": "unchanged since the ETag given in If-None-Match"},
        **NOT_FOUND,
    },
)
def pull_plans(
    session: SessionDep,
    node: NodeAuth,
    if_none_match: Annotated[str | None, Header(max_length=2000)] = None,
    kind: Annotated[
        list[PlanKind] | None,
        Query(
            max_length=len(KINDS),
            description="the kinds of plan the agent runs [default: every kind]",
        ),
    ] = None,
) -> Response:
    """The plans that pick this token's node, with an ETag: polled with If-None-Match, an
    unchanged answer is a bodiless 304 (a proxy's weak form of the tag matches too)."""
    found = session.get(Node, node.id)
    if found is None:  # deleted since its token was checked
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"node {node.name!r} not found")
    body = plans.node_plans(session, found, kinds=kind or KINDS).model_dump_json()
    etag = plans.plan_etag(body)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    given = {tag.strip().removeprefix("W/") for tag in (if_none_match or "").split(",")}
    if etag in given or "*" in given:
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@agent_router.put(
    "/status", status_code=status.HTTP_204_NO_CONTENT, responses={**BAD_BODY, **TOO_LARGE}
)
def report_status(body: NodeStatus, session: SessionDep, node: NodeAuth) -> None:
    """What this token's node says of its plans: versions run, skips and why, next run."""
    with write_transaction(session):
        plans.record_status(session, node.id, body)
        session.commit()
