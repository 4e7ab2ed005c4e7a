"""How many times a sweep measures each point: N times, or (`repeats = "auto"`) until the
point is precise enough. Both runners go round the grid, one measurement of each point per
round, so that a machine's slow drift lands on every point alike rather than on the last.

Auto: after each round, a point whose S_TG (S_PP for a point without generation) has a
relative standard error of the mean at most `repeat_target` is done, once it has 3
measurements (fewer give no spread to judge by); the others go round again, until
`max_repeats`, or until the sweep has run `repeat_budget_s` (no new round starts then).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from fleetbench.contract.sweep_spec import SweepSpec

__all__ = [
    "MIN_AUTO_REPEATS",
    "Key",
    "Timing",
    "needs_more",
    "relative_error",
    "still_to_measure",
]

MIN_AUTO_REPEATS = 3

Key = tuple[int, int, int]  # PP, TG, B
Timing = tuple[float, float]  # T_PP, T_TG of one measurement, seconds


def relative_error(key: Key, timings: Sequence[Timing]) -> float | None:
    """The relative standard error of the mean of the point's S_TG (S_PP without TG) over
    its measurements; None with fewer than two."""
    pp, tg, b = key
    speeds = [b * tg / t[1] for t in timings if t[1] > 0] if tg else []
    if not speeds:
        speeds = [b * pp / t[0] for t in timings if t[0] > 0]
    if len(speeds) < 2:
        return None
    mean = statistics.fmean(speeds)
    if mean <= 0:
        return None
    return statistics.stdev(speeds) / mean / math.sqrt(len(speeds))


def still_to_measure(
    spec: SweepSpec, measured: Mapping[Key, Sequence[Timing]], *, elapsed_s: float
) -> list[Key]:
    """The points (of `measured`, in its order) the next round measures."""
    return [k for k, timings in measured.items() if needs_more(spec, k, timings, elapsed_s)]


def needs_more(spec: SweepSpec, key: Key, timings: Sequence[Timing], elapsed_s: float) -> bool:
    """Whether a point measured `timings` so far is measured again: short of
    `spec.repeats`, or, with auto, not yet precise while repeats and time are left."""
    if spec.repeats != "auto":
        return len(timings) < spec.repeats
    if not timings:
        return True
    if elapsed_s >= spec.repeat_budget_s or len(timings) >= spec.max_repeats:
        return False
    if len(timings) < MIN_AUTO_REPEATS:
        return True
    error = relative_error(key, timings)
    return error is None or error > spec.repeat_target
