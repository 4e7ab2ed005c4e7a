"""Storing reports: each validated before any transaction starts, then one short write
transaction of set-based statements for a whole batch (no ORM unit of work), with every
projection of the runs (registry.projections: the latest curves, the comparison's sums,
the regression judge's queue, ...) brought up to date in it. Rows that never change once
written (engine builds, models and their facts) are remembered per process, so most
ingests look them up not at all.

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
from fleetbench.registry.ingest.batch import ingest_batch
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
]
