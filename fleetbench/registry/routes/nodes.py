from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, HTTPException, Response, status

from fleetbench.registry import crud
from fleetbench.registry.below_class import BelowClass, nodes_below
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.deps import PathsShown, ReadAccess, SessionDep, SettingsDep
from fleetbench.registry.hardware import hardware_class
from fleetbench.registry.health import missed_schedule, node_health
from fleetbench.registry.params import NodePath
from fleetbench.registry.responses import NOT_FOUND
from fleetbench.registry.schemas import NodeDetail, NodePublic, NodesPublic

router = APIRouter(prefix="/nodes", tags=["nodes"], dependencies=[ReadAccess])


# A plan's skip says what the node found of a path (`model missing: /models/x.gguf ...`).
SKIP_HIDDEN = "skipped: a reader or admin token shows why"


def _plans(states: list[dict[str, object]], shown: bool) -> list[dict[str, object]]:
    if shown:
        return states
    return [s | {"skipped": SKIP_HIDDEN} if s.get("skipped") else s for s in states]


def _public(
    summary: crud.NodeSummary,
    settings: RegistrySettings,
    shown: bool,
    below: dict[int, BelowClass],
) -> dict[str, object]:
    now = datetime.now(UTC)
    missed = missed_schedule(
        summary.next_run_at, now=now, grace=timedelta(minutes=settings.missed_after_minutes)
    )
    status = summary.plan_status or {}
    return {
        "name": summary.name,
        "labels": summary.labels,
        "created_at": summary.created_at,
        "last_run_at": summary.last_run_at,
        "runs": summary.runs,
        "hardware": summary.hardware,
        "hardware_class": hardware_class(summary.hardware),
        "engine": summary.engine,
        "last_status": summary.last_status,
        "open_regressions": summary.open_regressions,
        "plans": _plans(status.get("plans", []), shown),
        "status_reported_at": summary.status_reported_at,
        "next_run_at": summary.next_run_at,
        "missed_schedule": missed,
        "sweep_requested_at": summary.sweep_requested_at,
        "accelerator_note": summary.accelerator_note,
        "kv_prediction_error_pct": summary.kv_prediction_error_pct,
        "below_class": below.get(summary.node_id),
        "health": node_health(
            last_run_at=summary.last_run_at,
            last_status=summary.last_status,
            off_accelerator=summary.accelerator_note is not None,
            open_regressions=summary.open_regressions,
            missed=missed,
            now=now,
            stale_after=timedelta(hours=settings.stale_after_hours),
        ),
    }


@router.get("", response_model=NodesPublic)
def read_nodes(session: SessionDep, settings: SettingsDep, shown: PathsShown) -> Response:
    """Every node: its hardware and engine build, when it last ran, its plans (the version
    it runs of each, skips and why: why, to a reader or admin token), when it runs next,
    whether it missed its schedule, whether it is far below its hardware class, its
    health."""
    summaries = crud.list_nodes(session)
    below = nodes_below(session)
    nodes = [NodePublic.model_validate(_public(s, settings, shown, below)) for s in summaries]
    # Serialized here: FastAPI would validate and dump the list a second time.
    page = NodesPublic(data=nodes, count=len(nodes))
    return Response(page.model_dump_json(), media_type="application/json")


@router.get("/{name:path}", response_model=NodeDetail, responses=NOT_FOUND)
def read_node(
    name: NodePath, session: SessionDep, settings: SettingsDep, shown: PathsShown
) -> NodeDetail:
    """One node with the hardware fingerprints it has had, newest first."""
    found = crud.get_node(session, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"node {name!r} not found")
    summary, fingerprints = found
    public = _public(summary, settings, shown, nodes_below(session))
    return NodeDetail.model_validate({**public, "fingerprints": fingerprints})
