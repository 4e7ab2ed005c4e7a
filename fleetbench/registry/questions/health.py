"""A node's health on the fleet overview, from its summary."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

__all__ = ["Health", "node_health"]

Health = Literal["no runs", "failing", "regressed", "stale", "ok"]


def node_health(
    *,
    last_run_at: datetime | None,
    last_status: str | None,
    open_regressions: int,
    now: datetime,
    stale_after: timedelta,
) -> Health:
    """The most pressing of: never ran, its latest run failed, a regression nobody has
    acknowledged, no run for `stale_after`; else ok."""
    if last_run_at is None:
        return "no runs"
    if last_status == "failed":
        return "failing"
    if open_regressions:
        return "regressed"
    if now - last_run_at > stale_after:
        return "stale"
    return "ok"
