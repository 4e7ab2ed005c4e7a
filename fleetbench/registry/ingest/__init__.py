"""Storing reports: each validated before any transaction starts, then one short write
transaction of plain inserts (no ORM unit of work), with the node's latest curve and the
regressions of its series brought up to date in it.

What an ingest costs was measured under load (bench/load.py; README, "Holding a fleet"): the
ORM objects of the regression refresh's history read and of the run's own flush took two
thirds of a core's time per report. Here the history is read as plain rows, the run and its
points are inserted with executemany, and the rows that never change once written (engine
builds, models and their facts) are remembered per process, so most ingests look them up
not at all.

Rooms: `answers` (what a report is answered, the bounds), `statements` (built once per
dialect), `rows` (each step's rows for a whole batch), `batch` (the steps in one
transaction), `service` (the Ingest the application holds, over registry.writer).
"""

from fleetbench.registry.ingest.answers import (
    IngestLimits,
    ReportRefused,
    RunConflict,
    Stored,
    check_size,
)
from fleetbench.registry.ingest.batch import ingest_batch, ingest_report
from fleetbench.registry.ingest.rows import KnownRows, build_identity
from fleetbench.registry.ingest.service import Ingest
from fleetbench.registry.ingest.statements import MODEL_FACTS

__all__ = [
    "MODEL_FACTS",
    "Ingest",
    "IngestLimits",
    "KnownRows",
    "ReportRefused",
    "RunConflict",
    "Stored",
    "build_identity",
    "check_size",
    "ingest_batch",
    "ingest_report",
]
