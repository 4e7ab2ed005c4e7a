"""A node's health on the fleet overview, from its summary."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

__all__ = ["Health", "missed_schedule", "node_health"]

Health = Literal[
    "no runs", "failing", "off accelerator", "regressed", "missed schedule", "stale", "ok"
]


def missed_schedule(next_run_at: datetime | None, *, now: datetime, grace: timedelta) -> bool:
    """The node said it would sweep by `next_run_at`, and has not said more for `grace`
    after it (jitter and busy postponements fit within it)."""
    return next_run_at is not None and now - next_run_at > grace


def node_health(
    *,
    last_run_at: datetime | None,
    last_status: str | None,
    off_accelerator: bool,
    open_regressions: int,
    missed: bool,
    now: datetime,
    stale_after: timedelta,
) -> Health:
    """The most pressing of: never ran, its latest run failed, its latest run measured the
    CPU of a node with a GPU (its curve is not the GPU's), a regression nobody has
    acknowledged, a planned sweep missed, no run for `stale_after`; else ok."""
    if last_run_at is None:
        return "no runs"
    if last_status == "failed":
        return "failing"
    if off_accelerator:
        return "off accelerator"
    if open_regressions:
        return "regressed"
    if missed:
        return "missed schedule"
    if now - last_run_at > stale_after:
        return "stale"
    return "ok"
