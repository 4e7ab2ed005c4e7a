"""Did the curve's shape change: did its knee move when something known changed?

A build can leave S_TG at B=1 alone and still halve the concurrency worth running (the knee
moving from 8 streams to 4): each point's series may move less than its noise while the
curve's shape changes. So the knee of every run's curve (curves.knee, at one PP x TG) is
a series of its own, judged differently from throughput: a knee is a small integer that
noise flips between neighbours now and then, not a measurement with a spread. At a known
change (the llama.cpp build, binding, hardware or settings), the knee moved when the runs
before it agree on one knee (at least 3 of them, 3 in 4 agreeing) and every run after it,
at least `confirm_known` of them, agrees on another. Pure functions over a series' runs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from fleetbench.registry.curves.knee import find_knee
from fleetbench.registry.regressions.rules import (
    DetectionSettings,
    SeriesRun,
    Step,
    follows_change,
)

__all__ = ["KNEE_METRIC", "find_knee_shifts", "knee_series"]

KNEE_METRIC: Final = "knee"  # the metric of a knee's series and of the steps found in it
_LEAST_BEFORE = 3
_AGREEING_BEFORE = 0.75


def knee_series(
    by_b: Mapping[int, Sequence[SeriesRun]],
) -> list[SeriesRun]:
    """Each run's knee, as a series (oldest first), from the S_TG series of one PP x TG
    keyed by B. Only runs that measured the B values most runs did: a run missing a point
    has a curve of another shape, not another knee."""
    points: dict[object, dict[int, float]] = {}
    first_seen: dict[object, SeriesRun] = {}
    for b, runs in by_b.items():
        for run in runs:
            points.setdefault(run.run_id, {})[b] = run.value
            first_seen.setdefault(run.run_id, run)
    usual = Counter(frozenset(p) for p in points.values()).most_common(1)
    if not usual:
        return []
    shape = usual[0][0]
    if len(shape) < 2:
        return []
    series = []
    for run_id, curve in points.items():
        if frozenset(curve) != shape:
            continue
        knee = find_knee(list(curve.items()))
        if knee is not None:
            run = first_seen[run_id]
            series.append(dataclasses.replace(run, value=float(knee), repeat_noise=None))
    return sorted(series, key=lambda r: (r.started_at, str(r.run_id)))


def find_knee_shifts(
    runs: Sequence[SeriesRun],
    settings: DetectionSettings | None = None,
    *,
    judge_from: int = 0,
    known_steps: Iterable[int] = (),
) -> list[Step]:
    """The knee moves at known changes in a knee series (`runs` oldest first, from
    knee_series), from `judge_from` on; `known_steps` are taken as they were (a segment
    before a move starts at it)."""
    s = settings or DetectionSettings()
    starts = {*known_steps}
    steps = []
    first = max(1, judge_from)
    known = follows_change(runs, first)
    for i in range(first, len(runs)):
        if not known[i]:
            continue
        segment_start = max((j for j in starts if j < i), default=0)
        before = runs[max(segment_start, i - s.lookback) : i]
        end = next((j for j in range(i + 1, len(runs)) if known[j]), len(runs))
        after = runs[i : min(end, i + s.window)]
        step = _moved(before, after, s)
        if step is not None:
            steps.append(step)
            starts.add(i)
    return steps


def _moved(
    before: Sequence[SeriesRun], after: Sequence[SeriesRun], s: DetectionSettings
) -> Step | None:
    if len(before) < _LEAST_BEFORE or len(after) < s.confirm_known:
        return None
    old, agreeing = Counter(r.value for r in before).most_common(1)[0]
    if agreeing < _AGREEING_BEFORE * len(before):
        return None  # the knee flipped before: no knee to move from
    new = {r.value for r in after}
    if len(new) != 1 or (moved_to := new.pop()) == old:
        return None
    return Step(
        before_run=before[-1],
        first=after[0],
        before=old,
        after=moved_to,
        change=moved_to / old - 1,
        noise=0.0,  # a knee has no spread to speak of; its agreement stands for it
        confidence=agreeing / len(before),
        runs_before=len(before),
        runs_after=len(after),
        cause_kinds=after[0].changes_from(before[-1]),
    )
