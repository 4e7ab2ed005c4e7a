"""What ingest answers each report: stored (new, or a retry of the same body), or refused
before anything of it is written; and the bounds it refuses a report over."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from fleetbench.contract import wire


class RunConflict(Exception):
    """A run with this id exists and its report differs from the one sent now."""


class ReportRefused(Exception):
    """The report is valid but over a bound of the registry's (say which and how to raise
    it); answered 422."""


@dataclass(frozen=True)
class IngestLimits:
    max_points_per_report: int = 1024
    max_series_per_node: int = 1024
    # builds, models and model facts each node's reports may make (models.CreatedByNode)
    max_rows_per_node: int = 500


@dataclass(frozen=True)
class Stored:
    run_id: uuid.UUID
    created: bool


def check_size(report: wire.RunReport, limits: IngestLimits) -> None:
    points = len(report.points) + len(report.serving_points) + len(report.failures)
    if points > limits.max_points_per_report:
        raise ReportRefused(
            f"the report holds {points} points (measured and failed), over this registry's "
            f"limit of {limits.max_points_per_report} (FLEETBENCH_MAX_POINTS_PER_REPORT)"
        )
