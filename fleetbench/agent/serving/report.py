"""A serving sweep's outcome as a run report (contract.wire): the server as the engine
(llama-server's build number and commit read from its build string), one serving point per
concurrency measured, a failed point per concurrency that was not, and what a search found."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

from fleetbench.agent.fingerprint import THIS_AGENT, take_fingerprint
from fleetbench.agent.serving.sweep import ServingOutcome, serve_sweep
from fleetbench.contract.bounds import storable_text
from fleetbench.contract.serve_spec import ServeSpec
from fleetbench.contract.wire import (
    ERROR_LENGTH,
    REASON_LENGTH,
    SCHEMA_VERSION,
    EngineBuild,
    FailedPoint,
    HardwareFingerprint,
    ModelInfo,
    RunReport,
    ServerIdentity,
    SloSearch,
)

__all__ = ["finished_report", "measure_serving", "serving_report"]

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


def serving_report(
    outcome: ServingOutcome,
    spec: ServeSpec,
    *,
    model: str,
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
    points = outcome.points
    status = "failed" if not points else "partial" if failures else "ok"
    server = outcome.server
    search = outcome.search
    return RunReport(
        schema_version=SCHEMA_VERSION,
        agent=THIS_AGENT,
        run_id=uuid.uuid4(),
        node=node,
        started_at=started_at,
        finished_at=finished_at,
        status=status,
        error=storable_text(failures[0].reason, ERROR_LENGTH) if status == "failed" else None,
        engine=_engine(outcome),
        model=ModelInfo(name=model),
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
        slo_search=SloSearch(
            objective=search.objective,
            concurrency=search.concurrency,
            stop_reason=storable_text(search.stop_reason, 1000),
        )
        if search is not None
        else None,
        contention=outcome.contention,
        outputs=outcome.outputs,
    )


def finished_report(
    outcome: ServingOutcome, spec: ServeSpec, *, model: str, node: str, started_at: datetime
) -> RunReport:
    """The report of a sweep that just ended, with this machine's fingerprint."""
    return serving_report(
        outcome,
        spec,
        model=model,
        node=node,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        hardware=take_fingerprint(),
    )


def measure_serving(url: str, model: str, spec: ServeSpec, *, node: str) -> RunReport | str:
    """A serving sweep as a run report, or why nothing was measured: the server was serving
    others' requests (to try again later)."""
    started_at = datetime.now(UTC)
    outcome = serve_sweep(url, model, spec)
    if outcome.postponed is not None:
        return outcome.postponed
    return finished_report(outcome, spec, model=model, node=node, started_at=started_at)
