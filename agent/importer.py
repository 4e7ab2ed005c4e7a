"""Turn llama-batched-bench output that nodes already have into run reports."""

from __future__ import annotations

import uuid
from datetime import datetime

from agent.batched_bench_output import parse_batched_bench_output
from agent.wire import ModelInfo, RunReport

__all__ = ["IMPORT_NAMESPACE", "reports_from_output"]

# Import run ids are derived from the report's content: importing the same file again is
# a harmless retry (200 "already stored"), not a second copy of the run.
IMPORT_NAMESPACE = uuid.UUID("5b0f7a52-9a4e-4f4e-9d43-2f3c1b6a8e10")
_PLACEHOLDER = uuid.UUID(int=0)


def reports_from_output(
    text: str, *, node: str, model: ModelInfo, measured_at: datetime
) -> list[RunReport]:
    """One report per table (or block of JSONL records) in `text`. Raises NoTableFound."""
    reports = []
    for parsed in parse_batched_bench_output(text):
        draft = RunReport(
            run_id=_PLACEHOLDER,
            node=node,
            started_at=measured_at,
            status="ok",
            source="import",
            engine=parsed.engine,
            model=model,
            settings=parsed.settings,
            points=parsed.points,
        )
        content = draft.model_dump_json(exclude={"run_id"})
        reports.append(draft.model_copy(update={"run_id": uuid.uuid5(IMPORT_NAMESPACE, content)}))
    return reports
