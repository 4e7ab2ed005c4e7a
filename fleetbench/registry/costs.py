"""What storing reports and judging series cost, step by step: the CPU time of the thread
that did it, the SQL statements it sent and the rows it wrote or read. Ingest and the judge
measure each step of each batch; /metrics adds them up (`fleetbench_ingest_step_*`,
`fleetbench_judge_step_*`), so that what a report costs is a figure an operator can watch
and bench/load.py can divide by the reports it sent.

Statements are counted by an engine event (`count_statements`), per thread: each execution
the database runs counts once (an executemany of n rows counts n, as PostgreSQL runs n).
On SQLite the database runs in the thread that asks, so a step's CPU time includes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine.interfaces import ExecuteStyle

__all__ = ["StepCost", "Steps", "count_statements"]

_sent = threading.local()


def _statements_sent() -> int:
    return getattr(_sent, "statements", 0)


def _count(
    _conn: Any, _cursor: Any, _statement: str, parameters: Any, context: Any, executemany: bool
) -> None:
    # An executemany's parameters are a list of sets, one statement each; a batch of
    # SQLAlchemy's multi-row VALUES ("insertmanyvalues") is one statement, whatever it holds.
    many = (
        executemany
        and isinstance(parameters, list | tuple)
        and getattr(context, "execute_style", None) is not ExecuteStyle.INSERTMANYVALUES
    )
    _sent.statements = _statements_sent() + (len(parameters) if many else 1)


def count_statements(engine: Engine) -> None:
    """Counts the statements `engine` sends, for the steps measured in each thread."""
    if not event.contains(engine, "before_cursor_execute", _count):
        event.listen(engine, "before_cursor_execute", _count)


@dataclass
class StepCost:
    cpu_s: float = 0.0
    statements: int = 0
    rows: int = 0


@dataclass
class Steps:
    """The cost of each step of one piece of work (a batch of reports, a judge's pass), in
    the order the steps first ran.

    steps = Steps()
    with steps.step("runs") as cost:
        ...
        cost.rows += len(rows)
    """

    costs: dict[str, StepCost] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str) -> Iterator[StepCost]:
        cost = self.costs.setdefault(name, StepCost())
        cpu, sent = time.thread_time(), _statements_sent()
        try:
            yield cost
        finally:
            cost.cpu_s += time.thread_time() - cpu
            cost.statements += _statements_sent() - sent
