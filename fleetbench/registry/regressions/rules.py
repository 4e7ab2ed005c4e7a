"""Did a node get slower (or faster), when, by how much, and what changed?

A series is one node x model x PP x TG x B x metric (S_TG or S_PP), its runs in the order
they were measured. Each run carries what it ran on: the llama.cpp build, the binding, the
hardware fingerprint (drivers included) and the settings. A change in any of them is a
*known* change point.

The method (docs/design/regressions.md): a two-segment test at each candidate run,
with a noise estimate a step cannot shrink, confirmed by persistence. At each candidate run
i, the runs before it (back to the last accepted step, at most `lookback`) are compared with
the runs from i on (up to the next known change, at most `window`):

- centre: the mean of each side; change = after / before - 1;
- noise: the series' run-to-run standard deviation, from the differences between successive
  runs up to the end of the window (a level shift moves one difference only), never below
  the standard error the points' own repeats report, nor below `noise_floor`;
- a step is accepted when |change| >= `min_change`, the change is at least `z_known` (at a
  known change) or `z_unknown` (anywhere else: tested at every run, so stricter) standard
  errors of a difference of means away from zero, and over half of the runs after it moved
  the same way by at least half of `min_change`, the first of them included: one outlier
  that reverts moves its side's mean but not most of its runs, and the step is placed where
  the runs moved.

At a known change `confirm_known` runs after it are enough (the upgrade is the likely cause);
without one, `confirm_unknown` are needed. A step found is kept even when a later step goes
back: the slower build was slower while it ran. The defaults are set by
bench/regression_eval.py on real noise.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

__all__ = [
    "CAUSE_KINDS",
    "DETECTION_POWER_Z",
    "DetectionSettings",
    "SeriesRun",
    "Step",
    "describe_cause",
    "detectable_change",
    "find_steps",
    "follows_change",
    "min_detectable_change",
]

CauseKind = Literal["llama.cpp build", "binding", "hardware", "settings"]
CAUSE_KINDS: tuple[CauseKind, ...] = ("llama.cpp build", "binding", "hardware", "settings")

# For x, y independent normal with deviation sigma, |x - y| has median 0.9539 sigma and
# mean 1.1284 sigma (2 / sqrt(pi)).
_MEDIAN_DIFF_TO_SIGMA = 1 / 0.9539
_MEAN_DIFF_TO_SIGMA = math.sqrt(math.pi) / 2
# A step found with 95% probability clears the threshold by this many standard errors more
# (the one-sided normal quantile of 0.95).
DETECTION_POWER_Z = 1.645


@dataclass(frozen=True, slots=True)
class SeriesRun:
    """One run's value in a series and what it ran on (labels compared for equality)."""

    run_id: UUID
    started_at: datetime
    value: float
    build: str | None
    binding: str | None
    hardware: str | None
    settings: str | None
    repeat_noise: float | None = None  # relative standard error of the value, from repeats

    def changes_from(self, earlier: SeriesRun) -> tuple[CauseKind, ...]:
        pairs = (
            (self.build, earlier.build),
            (self.binding, earlier.binding),
            (self.hardware, earlier.hardware),
            (self.settings, earlier.settings),
        )
        return tuple(kind for kind, (a, b) in zip(CAUSE_KINDS, pairs, strict=True) if a != b)


@dataclass(frozen=True)
class DetectionSettings:
    min_change: float = 0.05  # the relative threshold
    z_known: float = 2.75  # standard errors a step at a known change must clear
    z_unknown: float = 5.0  # ... and one nothing explains (tested at every run: stricter)
    lookback: int = 20  # runs before a candidate compared with it
    window: int = 5  # runs after a candidate compared (fewer at a later known change)
    min_history: int = 4  # runs before a candidate needed at all
    confirm_known: int = 2  # runs after a known change needed to accept a step there
    confirm_unknown: int = 3  # runs after a change nothing explains
    noise_floor: float = 0.01  # below this a run-to-run spread is a lucky estimate
    # Runs the noise is estimated over, ending at a candidate's window: the same whether its
    # runs came one by one or in a burst (every judgement reads at least this many).
    noise_runs: int = 25


@dataclass(frozen=True)
class Step:
    """A lasting change in a series, starting at run `first`."""

    before_run: SeriesRun  # the last run before the step
    first: SeriesRun  # the first run after it
    before: float  # mean before
    after: float  # mean after
    change: float  # after / before - 1
    noise: float  # relative run-to-run standard deviation used
    confidence: float  # 1 - two-sided p of the z score, under normal noise
    runs_before: int
    runs_after: int
    cause_kinds: tuple[CauseKind, ...]

    @property
    def is_regression(self) -> bool:
        return self.change < 0

    def describe(self) -> str:
        """Its cause, as stored and shown."""
        return describe_cause(self.cause_kinds, self.before_run, self.first)


def find_steps(
    runs: Sequence[SeriesRun],
    settings: DetectionSettings | None = None,
    *,
    judge_from: int = 0,
    known_steps: Iterable[int] = (),
) -> list[Step]:
    """The steps in one series (`runs` oldest first), oldest first.

    Runs before `judge_from` were judged before: there, `known_steps` (indices of steps found
    then) mark where segments start and nothing is tested again, so a verdict never changes
    because older runs dropped out of view. Steps are returned from `judge_from` on.

    This runs for every series of every burst of runs a node reports, so what is needed
    once per series (which runs follow a known change, the changes between successive
    runs) is computed once, and only from where it is used."""
    s = settings or DetectionSettings()
    frozen = set(known_steps)
    first = max(1, judge_from)
    known = follows_change(runs, first)
    moves = _log_moves(runs)
    steps: list[Step] = []
    step_starts: list[int] = []
    segment_start = 0
    for i in range(1, first):
        if i in frozen:
            step_starts.append(i)
            segment_start = i
    for i in range(first, len(runs)):
        before = runs[max(segment_start, i - s.lookback) : i]
        end = next((j for j in range(i + 1, len(runs)) if known[j]), len(runs))
        after = runs[i : min(end, i + s.window)]
        # Right after a step the segment before a known change may be short: the series'
        # noise is known from its whole history by then.
        least_before = s.confirm_known if known[i] and segment_start > 0 else s.min_history
        needed = s.confirm_known if known[i] else s.confirm_unknown
        if len(before) < least_before or len(after) < needed:
            continue
        noise = _series_noise(runs, moves, i + len(after), {*step_starts, i}, s)
        step = _test_step(before, after, noise, s.z_known if known[i] else s.z_unknown, s)
        if step is not None:
            steps.append(step)
            step_starts.append(i)
            segment_start = i
    return steps


def _test_step(
    before: Sequence[SeriesRun],
    after: Sequence[SeriesRun],
    noise: float,
    z_needed: float,
    s: DetectionSettings,
) -> Step | None:
    try:
        centre_before = statistics.fmean(r.value for r in before)
        centre_after = statistics.fmean(r.value for r in after)
    except OverflowError:  # values no report may carry any more (figures <= 1e12)
        return None
    if centre_before <= 0:
        return None
    change = centre_after / centre_before - 1
    # Values so far apart that their ratio is no longer a number say nothing of a step.
    if not math.isfinite(change) or abs(change) < s.min_change:
        return None
    standard_error = noise * math.sqrt(1 / len(before) + 1 / len(after))
    z = abs(change) / standard_error
    if z < z_needed:
        return None
    half = s.min_change / 2
    moved = [math.copysign(1, change) * (r.value / centre_before - 1) >= half for r in after]
    # The step starts where the runs moved, and most runs after it stayed moved.
    if not moved[0] or sum(moved) * 2 <= len(after):
        return None
    return Step(
        before_run=before[-1],
        first=after[0],
        before=centre_before,
        after=centre_after,
        change=change,
        noise=noise,
        confidence=math.erf(z / math.sqrt(2)),
        runs_before=len(before),
        runs_after=len(after),
        cause_kinds=after[0].changes_from(before[-1]),
    )


def _log_moves(runs: Sequence[SeriesRun]) -> list[float | None]:
    """|log(value_j / value_j-1)| for each run j (None where either is not positive), as a
    difference of logs: finite for any positive finite values."""
    logs = [math.log(r.value) if r.value > 0 else None for r in runs]
    moves: list[float | None] = [None]
    for previous, current in itertools.pairwise(logs):
        moves.append(
            abs(current - previous) if current is not None and previous is not None else None
        )
    return moves


def _series_noise(
    runs: Sequence[SeriesRun],
    moves: Sequence[float | None],
    end: int,
    boundaries: set[int],
    s: DetectionSettings,
) -> float:
    """Relative run-to-run standard deviation over the `noise_runs` runs ending at `end`
    (exclusive), from the changes between
    successive runs (`moves`, from _log_moves), leaving out those across `boundaries` (the
    steps found and the one tested). Residuals around fitted segments would shrink it
    exactly where a step is tested; successive differences do not depend on where the
    segments are cut. The larger of a MAD-based and a mean-based estimate (the MAD alone
    misses the second mode of a machine that flips between two speeds); never below the
    points' own repeat spread nor `noise_floor`."""
    start = max(0, end - s.noise_runs)
    steps = [
        move
        for j in range(start + 1, end)
        if j not in boundaries and (move := moves[j]) is not None
    ]
    spread = 0.0
    if steps:
        spread = max(
            statistics.median(steps) * _MEDIAN_DIFF_TO_SIGMA,
            statistics.fmean(steps) * _MEAN_DIFF_TO_SIGMA,
        )
    repeats = [r.repeat_noise for r in runs[start:end] if r.repeat_noise is not None]
    repeat = statistics.median(repeats) if repeats else 0.0
    return max(spread, repeat, s.noise_floor)


def detectable_change(
    noise: float, runs_before: int, runs_after: int, settings: DetectionSettings | None = None
) -> float:
    """The smallest lasting relative step at a known change (a new build) that the detector
    finds with 95% probability, for a series of this run-to-run `noise` with these runs on
    each side: z_known + 1.645 standard errors of a difference of means, and never below
    `min_change` (the detector reports nothing smaller)."""
    s = settings or DetectionSettings()
    error = noise * math.sqrt(1 / max(runs_before, 1) + 1 / max(runs_after, 1))
    return max(s.min_change, (s.z_known + DETECTION_POWER_Z) * error)


def follows_change(runs: Sequence[SeriesRun], first: int = 1) -> list[bool]:
    """Whether each run (oldest first) follows a known change from the run before it; False
    before `first`, where it is not asked (the first run follows nothing)."""
    first = max(1, first)
    return [False] * min(first, len(runs)) + [
        bool(runs[j].changes_from(runs[j - 1])) for j in range(first, len(runs))
    ]


def min_detectable_change(
    runs: Sequence[SeriesRun], settings: DetectionSettings | None = None
) -> float | None:
    """What `detectable_change` says of the next build of this series (`runs` oldest
    first): its own noise (as the detector estimates it), the runs before the change (the
    history, within the look-back) and the runs a build keeps (the median stretch between
    known changes, the latest included, within the window) after it. 1.0 (blind: not even a
    halving shows) when builds change faster than the detector confirms a step at one; None
    with fewer than 3 runs: no noise to tell by."""
    s = settings or DetectionSettings()
    if len(runs) < 3:
        return None
    starts = [0] + [j for j, known in enumerate(follows_change(runs)) if known]
    stretches = [end - start for start, end in itertools.pairwise([*starts, len(runs)])]
    per_build = round(statistics.median(stretches))
    if per_build < s.confirm_known:
        return 1.0
    noise = _series_noise(runs, _log_moves(runs), len(runs), set(starts[1:]), s)
    return min(
        1.0, detectable_change(noise, min(len(runs), s.lookback), min(per_build, s.window), s)
    )


def describe_cause(kinds: Sequence[CauseKind], before: SeriesRun, after: SeriesRun) -> str:
    """A sentence naming what changed between two runs, with the values where they help."""
    if not kinds:
        return "nothing known changed (same build, binding, hardware and settings)"
    parts = []
    for kind in kinds:
        if kind == "llama.cpp build":
            parts.append(f"llama.cpp build changed ({before.build} -> {after.build})")
        elif kind == "binding":
            parts.append(f"binding changed ({before.binding} -> {after.binding})")
        elif kind == "hardware":
            parts.append(f"hardware or driver changed ({before.hardware} -> {after.hardware})")
        else:
            parts.append("settings changed")
    return "; ".join(parts)
