"""A serving sweep's outcome as a run report (contract.wire, schema version 2): the server
as the engine (llama-server's build number and commit read from its build string), one
serving point per concurrency measured, a failed point per concurrency that was not."""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict
from datetime import datetime

from fleetbench.agent.serving.stats import ServingPoint as MeasuredPoint
from fleetbench.agent.serving.sweep import ServeSpec, ServingOutcome
from fleetbench.contract.bounds import storable_text
from fleetbench.contract.wire import (
    ERROR_LENGTH,
    REASON_LENGTH,
    SERVING_SCHEMA_VERSION,
    EngineBuild,
    FailedPoint,
    HardwareFingerprint,
    ModelInfo,
    RunReport,
    ServerIdentity,
    ServingPoint,
)

__all__ = ["serving_report"]

_BUILD = re.compile(r"^b(\d+)-([0-9a-f]{7,40})")  # llama-server's build_info: b7100-0c1e570


def _engine(outcome: ServingOutcome) -> EngineBuild:
    server = outcome.server
    found = _BUILD.match(server.build or "") if server.kind == "llama-server" else None
    if found is not None:
        return EngineBuild(
            engine="llama.cpp",
            build_number=int(found.group(1)),
            commit=found.group(2),
            binding="llama-server",
        )
    build = storable_text(server.build, 100) if server.build else None
    return EngineBuild(engine=server.kind, binding=server.kind, binding_version=build)


def _errors(errors: dict[str, int]) -> dict[str, int]:
    """Error kinds as the wire takes them: storable names, at most 32 (the rest as other)."""
    kept: dict[str, int] = {}
    for kind, count in sorted(errors.items(), key=lambda item: -item[1]):
        name = storable_text(kind, 200) if len(kept) < 31 else "other"
        kept[name] = kept.get(name, 0) + count
    return kept


def _point(point: MeasuredPoint) -> ServingPoint:
    fields = asdict(point)
    fields["errors"] = _errors(fields["errors"])
    spreads = {
        f"{name}_{q}": value
        for name in ("per_user_tps", "ttft_ms", "itl_ms", "e2e_ms")
        for q, value in fields.pop(name).items()
    }
    return ServingPoint.model_validate({**fields, **spreads})


def serving_report(
    outcome: ServingOutcome,
    spec: ServeSpec,
    *,
    node: str,
    started_at: datetime,
    finished_at: datetime,
    hardware: HardwareFingerprint | None,
) -> RunReport:
    failures = [
        FailedPoint(
            pp=spec.prompt_tokens,
            tg=spec.gen_tokens,
            b=level,
            reason=storable_text(why, REASON_LENGTH),
        )
        for level, why in outcome.failures
    ]
    points = [_point(p) for p in outcome.points]
    status = "failed" if not points else "partial" if failures else "ok"
    server = outcome.server
    return RunReport(
        schema_version=SERVING_SCHEMA_VERSION,
        run_id=uuid.uuid4(),
        node=node,
        started_at=started_at,
        finished_at=finished_at,
        status=status,
        error=storable_text(failures[0].reason, ERROR_LENGTH) if status == "failed" else None,
        engine=_engine(outcome),
        model=ModelInfo(name=spec.model),
        hardware=hardware,
        kind="serving",
        server=ServerIdentity(
            kind=server.kind if server.kind != "unreachable" else "openai-compatible",
            build=storable_text(server.build, 200) if server.build else None,
            model_path=storable_text(server.model_path, 1000) if server.model_path else None,
            n_ctx=server.n_ctx,
            slots=server.slots,
            ctx_per_slot=server.ctx_per_slot,
            prompt_tokens=spec.prompt_tokens,
            gen_tokens=spec.gen_tokens,
            prompt_exact=outcome.prompt_exact,
        ),
        serving_points=points,
        failures=failures,
    )
