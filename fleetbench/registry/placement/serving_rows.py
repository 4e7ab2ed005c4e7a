"""The rows serving placement reads: each node's latest successful serving run of the model
(latest_serving_runs, kept by ingest) with its points, one row per concurrency. A node runs
one server per model, a handful of concurrencies each: a 1,000-node answer reads a few
thousand rows, chosen from in Python (registry.placement.rules.serving_choices)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, bindparam, select

from fleetbench.registry.models import (
    EngineBuild,
    LatestServingRun,
    Node,
    Run,
    ServingPointRow,
)
from fleetbench.registry.placement.rules import ServingRow

__all__ = ["served_nodes", "serving_rows"]


def _conditions(since: bool, prompt: bool) -> list[ColumnElement[bool]]:
    """Which latest serving runs count: of the `model_ids`, since `since`, with prompts of
    at least `prompt_tokens` (bound parameters)."""
    conditions: list[ColumnElement[bool]] = [
        LatestServingRun.model_id.in_(bindparam("model_ids", expanding=True))
    ]
    if since:
        conditions.append(LatestServingRun.started_at >= bindparam("since"))
    if prompt:
        conditions.append(LatestServingRun.prompt_tokens >= bindparam("prompt_tokens"))
    return conditions


def served_nodes(*, since: bool, prompt: bool) -> Select[Any]:
    """The nodes with a serving run that counts (see _conditions), as a subquery's select:
    what offline placement leaves to serving placement."""
    return select(LatestServingRun.node_id).where(*_conditions(since, prompt))


@functools.cache
def _statement(since: bool, prompt: bool) -> Select[Any]:
    # A name covering several model files: each node's newest serving run across them.
    return (
        select(
            Node.name,
            LatestServingRun.run_id,
            LatestServingRun.started_at,
            EngineBuild.build_number,
            Run.server,
            LatestServingRun.prompt_tokens,
            LatestServingRun.gen_tokens,
            LatestServingRun.slots,
            LatestServingRun.ctx_per_slot,
            ServingPointRow.concurrency,
            ServingPointRow.total_tps,
            ServingPointRow.per_user_tps_p10,
            ServingPointRow.ttft_ms_p90,
            ServingPointRow.requests,
            ServingPointRow.completed,
        )
        .select_from(LatestServingRun)
        .join(Node, Node.id == LatestServingRun.node_id)
        .join(Run, Run.id == LatestServingRun.run_id)
        .join(EngineBuild, EngineBuild.id == LatestServingRun.build_id)
        .join(ServingPointRow, ServingPointRow.run_id == LatestServingRun.run_id)
        .where(*_conditions(since, prompt))
        .order_by(
            Node.name,
            LatestServingRun.started_at.desc(),
            LatestServingRun.run_id,
            ServingPointRow.concurrency,
        )
    )


def serving_rows(
    connection: Any,
    *,
    model_ids: Sequence[int],
    since: datetime | None,
    prompt_tokens: int | None,
) -> list[ServingRow]:
    """Every point of each node's latest serving run of the models (the newest across them
    where a name covers several files), by node then concurrency."""
    statement = _statement(since is not None, prompt_tokens is not None)
    params = {"model_ids": list(model_ids), "since": since, "prompt_tokens": prompt_tokens}
    rows: list[ServingRow] = []
    newest: dict[str, Any] = {}  # each node's run, the first (newest) one read
    for row in connection.execute(statement, params):
        if newest.setdefault(row.name, row.run_id) != row.run_id:
            continue
        rows.append(
            ServingRow(
                node=row.name,
                run_id=row.run_id,
                measured_at=row.started_at,
                llama_cpp_build=row.build_number,
                server=str((row.server or {}).get("kind", "unknown")),
                prompt_tokens=row.prompt_tokens,
                gen_tokens=row.gen_tokens,
                slots=row.slots,
                ctx_per_slot=row.ctx_per_slot,
                concurrency=row.concurrency,
                total_tps=row.total_tps,
                per_user_tps_p10=row.per_user_tps_p10,
                ttft_ms_p90=row.ttft_ms_p90,
                clean=row.completed == row.requests,
            )
        )
    return rows
