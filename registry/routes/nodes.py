from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from registry import crud
from registry.deps import ReadAccess, SessionDep
from registry.schemas import FingerprintPublic, NodeDetail, NodePublic, NodesPublic

router = APIRouter(prefix="/nodes", tags=["nodes"], dependencies=[ReadAccess])


@router.get("", response_model=NodesPublic)
def read_nodes(session: SessionDep) -> NodesPublic:
    """Every node, with when it last ran and how many runs it has reported."""
    nodes = [
        NodePublic(
            name=node.name,
            labels=node.labels,
            created_at=node.created_at,
            last_run_at=last_run_at,
            runs=runs,
        )
        for node, last_run_at, runs in crud.list_nodes(session)
    ]
    return NodesPublic(data=nodes, count=len(nodes))


@router.get("/{name}", response_model=NodeDetail)
def read_node(name: str, session: SessionDep) -> NodeDetail:
    """One node with the hardware fingerprints it has had, newest first."""
    found = crud.get_node(session, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"node {name!r} not found")
    node, fingerprints = found
    runs = crud.list_runs(session, node=name, model=None, since=None, limit=1, offset=0)
    latest, count = runs
    return NodeDetail(
        name=node.name,
        labels=node.labels,
        created_at=node.created_at,
        last_run_at=latest[0].started_at if latest else None,
        runs=count,
        fingerprints=[FingerprintPublic.model_validate(f) for f in fingerprints],
    )
