"""What the registry's API answers (the request side is the wire format, agent.wire).
Named by role: XPublic for one thing, XsPublic(data, count) for a page of them."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agent import wire
from registry.models import Run

__all__ = [
    "FingerprintPublic",
    "ModelPublic",
    "ModelsPublic",
    "NodeDetail",
    "NodePublic",
    "NodesPublic",
    "RunDetail",
    "RunPublic",
    "RunsPublic",
    "run_detail",
    "run_public",
]


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class NodePublic(_Public):
    name: str
    labels: dict[str, Any]
    created_at: datetime
    last_run_at: datetime | None
    runs: int


class NodesPublic(_Public):
    data: list[NodePublic]
    count: int


class FingerprintPublic(_Public):
    hash: str
    data: dict[str, Any]
    first_seen: datetime
    last_seen: datetime


class NodeDetail(NodePublic):
    fingerprints: list[FingerprintPublic]


class ModelPublic(wire.ModelInfo):
    model_config = ConfigDict(from_attributes=True, frozen=True)
    runs: int
    last_run_at: datetime | None


class ModelsPublic(_Public):
    data: list[ModelPublic]
    count: int


class RunPublic(_Public):
    id: UUID
    node: str
    model: str
    model_sha256: str | None
    status: wire.RunStatus
    error: str | None
    source: str
    started_at: datetime
    finished_at: datetime | None
    received_at: datetime
    engine: wire.EngineBuild
    settings: wire.RunSettings


class RunsPublic(_Public):
    data: list[RunPublic]
    count: int


class RunDetail(RunPublic):
    hardware: FingerprintPublic | None
    points: list[wire.Point]
    failures: list[wire.FailedPoint]


def _run_fields(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "node": run.node.name,
        "model": run.model.name,
        "model_sha256": run.model.sha256,
        "status": run.status,
        "error": run.error,
        "source": run.source,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "received_at": run.received_at,
        "engine": wire.EngineBuild.model_validate(run.build, from_attributes=True),
        "settings": wire.RunSettings.model_validate(run, from_attributes=True),
    }


def run_public(run: Run) -> RunPublic:
    return RunPublic.model_validate(_run_fields(run))


def run_detail(run: Run) -> RunDetail:
    return RunDetail.model_validate(
        {
            **_run_fields(run),
            "hardware": run.fingerprint,
            "points": [wire.Point.model_validate(p, from_attributes=True) for p in run.points],
            "failures": [
                wire.FailedPoint.model_validate(f, from_attributes=True) for f in run.failures
            ],
        }
    )
