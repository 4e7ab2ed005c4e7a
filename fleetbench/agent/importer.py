"""Turn llama-batched-bench output that nodes already have into run reports."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from typing import NamedTuple

from fleetbench.agent.batched_bench_output import (
    BadRow,
    PassedOver,
    parse_batched_bench_output,
)
from fleetbench.agent.fingerprint import THIS_AGENT
from fleetbench.contract.device_bandwidth import device_key, published_name
from fleetbench.contract.wire import (
    SCHEMA_VERSION,
    DeclaredDevice,
    HardwareData,
    HardwareFingerprint,
    ModelInfo,
    Probes,
    RunReport,
    defining_json,
)

__all__ = ["IMPORT_NAMESPACE", "ImportedRun", "declared_hardware", "reports_from_output"]

# Import run ids are derived from what was measured (not from when: the time defaults to
# the file's mtime, which a copy changes): importing the same table again is a harmless
# retry, never a second copy of the run.
IMPORT_NAMESPACE = uuid.UUID("5b0f7a52-9a4e-4f4e-9d43-2f3c1b6a8e10")
_PLACEHOLDER = uuid.UUID(int=0)


class ImportedRun(NamedTuple):
    line: int  # where its table or records start in the text
    report: RunReport
    left_out: tuple[str, ...]  # columns its author added, read past


def declared_hardware(device: str) -> HardwareFingerprint:
    """The fingerprint of a device named by hand: declared, not probed, spelt as the
    published figures spell it where they know it (its hash is the name's, so that every
    table imported for one device is one machine's)."""
    named = published_name(device)
    data = HardwareData(probes=Probes(declared=DeclaredDevice(device=named)), complete=True)
    digest = hashlib.sha256(f"declared:{device_key(device)}".encode()).hexdigest()
    return HardwareFingerprint(hash=digest, data=data.model_dump(mode="json", exclude_none=True))


def reports_from_output(
    text: str,
    *,
    node: str,
    model: ModelInfo,
    measured_at: datetime,
    device: str | None = None,
    skipped: list[BadRow] | None = None,
    passed_over: list[PassedOver] | None = None,
) -> list[ImportedRun]:
    """One report per table (or block of JSONL records) in `text`, a failed run for a
    header with no rows (the run crashed: its error is the reason); with `skipped`, tables
    holding a row that is no valid measurement are left out and said there, and other
    tools' tables in `passed_over`. Raises BatchedBenchOutputError for text that cannot be
    read. `device`: what measured it, as whoever imports it names it (its bandwidth, class
    and fit are that device's)."""
    hardware = declared_hardware(device) if device else None
    reports = []
    for parsed in parse_batched_bench_output(text, skipped=skipped, passed_over=passed_over):
        draft = RunReport(
            schema_version=SCHEMA_VERSION,
            agent=THIS_AGENT,
            run_id=_PLACEHOLDER,
            node=node,
            started_at=measured_at,
            status="failed" if parsed.failure is not None else "ok",
            error=parsed.failure,
            source="import",
            engine=parsed.engine,
            model=model,
            settings=parsed.settings,
            points=parsed.points,
            hardware=hardware,
        )
        identity = _measured(draft)
        if parsed.failure is not None:
            # A failed run measured nothing that tells two crashes apart: where its header
            # stands and when it ran do.
            identity += f"\nline {parsed.line}, {measured_at.isoformat()}"
        run_id = uuid.uuid5(IMPORT_NAMESPACE, identity)
        report = draft.model_copy(update={"run_id": run_id})
        reports.append(ImportedRun(parsed.line, report, parsed.left_out))
    return reports


def _measured(report: RunReport) -> str:
    """What a run id is derived from: what defines the run, without the model's per-layer
    facts and the bytes its decode reads (read from the model file by agents that read
    them: the same table imported by an older agent and a newer one is one run)."""
    later = ("layers", "weight_bytes", "expert_bytes", "expert_count", "expert_used_count")
    model = report.model.model_copy(update=dict.fromkeys(later))
    return defining_json(
        report.model_copy(update={"model": model}), exclude={"run_id", "started_at"}
    )
