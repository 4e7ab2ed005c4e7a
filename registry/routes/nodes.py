from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from registry import crud
from registry.deps import ReadAccess, SessionDep
from registry.schemas import NodeDetail, NodePublic, NodesPublic

router = APIRouter(prefix="/nodes", tags=["nodes"], dependencies=[ReadAccess])


def _public(summary: crud.NodeSummary) -> dict[str, object]:
    return {
        "name": summary.node.name,
        "labels": summary.node.labels,
        "created_at": summary.node.created_at,
        "last_run_at": summary.last_run_at,
        "runs": summary.runs,
    }


@router.get("", response_model=NodesPublic)
def read_nodes(session: SessionDep) -> NodesPublic:
    """Every node, with when it last ran and how many runs it has reported."""
    nodes = [NodePublic.model_validate(_public(s)) for s in crud.list_nodes(session)]
    return NodesPublic(data=nodes, count=len(nodes))


@router.get("/{name}", response_model=NodeDetail)
def read_node(name: str, session: SessionDep) -> NodeDetail:
    """One node with the hardware fingerprints it has had, newest first."""
    found = crud.get_node(session, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"node {name!r} not found")
    summary, fingerprints = found
    return NodeDetail.model_validate({**_public(summary), "fingerprints": fingerprints})
