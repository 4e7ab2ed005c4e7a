"""What a batching curve's points tell a user: at each concurrency B, the total decode speed,
what each of the B users gets (S_TG / B) and how long each waits per token, the prefill
speed, and whether B lies past the curve's knee (registry.curves.knee)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleetbench.registry.curves.knee import find_knee

__all__ = ["PointFigures", "curve_figures"]


@dataclass(frozen=True)
class PointFigures:
    b: int
    total_tps: float
    per_user_tps: float
    ms_per_token: float | None  # None where 1000·B/S_TG overflows (or S_TG is 0)
    prefill_tps: float | None
    past_knee: bool


def curve_figures(
    points: Sequence[tuple[int, float, float | None]], knee_threshold: float
) -> tuple[int | None, list[PointFigures]]:
    """The knee of (B, S_TG, S_PP) points and each point's figures, in the points' order."""
    knee = find_knee([(b, s_tg) for b, s_tg, _ in points], knee_threshold)
    figures = []
    for b, s_tg, s_pp in points:
        ms = 1000 * b / s_tg if s_tg else math.inf
        figures.append(
            PointFigures(
                b=b,
                total_tps=s_tg,
                per_user_tps=s_tg / b,
                ms_per_token=ms if math.isfinite(ms) else None,
                prefill_tps=s_pp,
                past_knee=knee is not None and b > knee,
            )
        )
    return knee, figures
