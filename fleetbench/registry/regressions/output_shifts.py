"""Did a node's model start to output something else: a driver update, a failing GPU, a
build that computes differently?

A node x model's runs that carry an output fingerprint (contract.outputs) form a series per
runner: the run's kind, its engine, backend and binding, and the settings that change
outputs (compare.output_rules.outputs_runner), for fingerprints taken another way never
compare. Each run's fingerprint is compared with the one before it (the KL divergence of its
distributions from the earlier ones, mean and p99 over the reference text, and the top-token
agreement), against the series' own floor: the largest difference between successive runs
with nothing known changed between them, among the `HISTORY` runs before it, leaving out the
shifts and the returns. A run is a **shift** where its difference is beyond that floor by
compare's bars (compare.output_rules, with `min_kl`): positions newly holding no numbers, or
the mean or p99 KL above twice the floor's and a least.

One run is enough. Speed has noise that one run cannot tell a step from; outputs have their
floor, and a run beyond it computed something else that time: a single wrong run (a GPU
failing now and then) is already a finding, and so is each one after. A run whose outputs
go back to those of the run before the latest shift (within the floor that shift was judged
against: a rollback, the failing GPU right again) is a **return**, no new finding. Pure
functions over a series' runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from uuid import UUID

from fleetbench.contract.outputs import OutputDifference, OutputFingerprint, compare_outputs
from fleetbench.registry.compare.output_rules import (
    Floor,
    beyond_floor,
    floor_of,
    newly_non_finite,
)
from fleetbench.registry.regressions.rules import SeriesRun, Step, describe_cause

__all__ = ["HISTORY", "OUTPUTS_METRIC", "OutputRun", "OutputShift", "find_output_shifts"]

OUTPUTS_METRIC: Final = "outputs"  # the metric of the shifts stored (at PP, TG and B 0)
# Runs before a candidate whose successive differences make its floor; the judge reads as
# many fingerprints before a node's new ones (each ~44 KB of JSON).
HISTORY = 8
_NOTHING_KNOWN = (
    "nothing known changed (same build, binding, hardware and settings): a failing device, "
    "or a driver or library the hardware fingerprint does not name"
)


@dataclass(frozen=True)
class OutputRun:
    """A run's fingerprint in its outputs series, and what the run ran on (`run`'s labels;
    its value is unused)."""

    run: SeriesRun
    outputs: OutputFingerprint

    @property
    def run_id(self) -> UUID:
        return self.run.run_id

    @property
    def started_at(self) -> datetime:
        return self.run.started_at


@dataclass(frozen=True)
class OutputShift(Step):
    """Outputs that changed at run `first` from run `before_run`: `before` is the floor's
    mean KL, `after` the shift's, `change` the top-token agreement - 1 (0 where only the
    probabilities moved). Every shift is a regression: outputs have no better direction."""

    difference: OutputDifference
    floor: Floor
    non_finite: int  # positions newly holding no numbers

    @property
    def is_regression(self) -> bool:
        return True

    def describe(self) -> str:
        d, floor = self.difference, self.floor
        figures = (
            f"KL mean {d.mean_kl:.4f} nats (floor {floor.mean_kl:.4f}), p99 {d.p99_kl:.4f} "
            f"(floor {floor.p99_kl:.4f}), top token the same at {d.top_token_agreement:.1%} of "
            f"{d.positions} positions"
        )
        if self.non_finite > 0:
            figures = f"{self.non_finite} positions' logits newly no numbers (NaN, inf); {figures}"
        cause = (
            describe_cause(self.cause_kinds, self.before_run, self.first)
            if self.cause_kinds
            else _NOTHING_KNOWN
        )
        return f"outputs changed: {figures}; {cause}"


def find_output_shifts(
    runs: Sequence[OutputRun],
    *,
    min_kl: float,
    judge_from: int = 0,
    known_steps: Iterable[int] = (),
) -> list[OutputShift]:
    """The shifts in one outputs series (`runs` oldest first, one runner), from `judge_from`
    on. Before it nothing is reported again, and the shifts stored (`known_steps`) are
    shifts whatever the runs say now (the floor leaves them out as it did)."""
    known = set(known_steps)
    shifts: list[OutputShift] = []
    compared_from = 0  # the first run that compares with the latest (texts, vocabularies)
    floor_seen: dict[int, OutputDifference] = {}  # run j's difference from run j-1, if kept
    latest: tuple[int, Floor] | None = None  # the latest shift not gone back from, its floor
    for i in range(1, len(runs)):
        before, run = runs[i - 1], runs[i]
        difference = compare_outputs(before.outputs, run.outputs)
        if difference is None:  # another text or vocabulary: nothing before compares
            compared_from, latest = i, None
            continue
        lookback = max(compared_from, i - HISTORY)
        floor = floor_of(d for j, d in floor_seen.items() if j > lookback)
        moved = _moved(before.outputs, run.outputs, difference, floor, min_kl)
        back = moved and latest is not None and _returned(runs, latest, run, min_kl)
        if i in known or (moved and not back):
            if i >= judge_from:
                shifts.append(_shift(before, run, difference, floor, i - lookback))
            latest = (i, floor)
        elif back:
            latest = None
        elif not run.run.changes_from(before.run):
            # The floor is what the series varies by with nothing known changed: never a
            # shift, a return or a new driver's difference, which would hide the next ones.
            floor_seen[i] = difference
    return shifts


def _moved(
    base: OutputFingerprint,
    new: OutputFingerprint,
    difference: OutputDifference,
    floor: Floor,
    min_kl: float,
) -> bool:
    return newly_non_finite(base, new) > 0 or beyond_floor(difference, floor, min_kl)


def _returned(
    runs: Sequence[OutputRun], latest: tuple[int, Floor], run: OutputRun, min_kl: float
) -> bool:
    """Whether `run`'s outputs are back to those of the run before the latest shift, within
    the floor that shift was judged against."""
    at, floor = latest
    base = runs[at - 1].outputs
    difference = compare_outputs(base, run.outputs)
    return difference is not None and not _moved(base, run.outputs, difference, floor, min_kl)


def _shift(
    before: OutputRun,
    run: OutputRun,
    difference: OutputDifference,
    floor: Floor,
    runs_before: int,
) -> OutputShift:
    return OutputShift(
        before_run=before.run,
        first=run.run,
        before=floor.mean_kl,
        after=difference.mean_kl,
        change=difference.top_token_agreement - 1,
        noise=0.0,  # the floor stands for it
        confidence=1.0,  # a comparison of two fingerprints, not a test under noise
        runs_before=runs_before,
        runs_after=1,
        cause_kinds=run.run.changes_from(before.run),
        difference=difference,
        floor=floor,
        non_finite=newly_non_finite(before.outputs, run.outputs),
    )
