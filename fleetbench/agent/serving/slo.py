"""The largest concurrency a server runs within an objective (`--slo "ttft_p90<=2000ms,
tps_per_user_p10>=10"`): double from 1 until a level fails it, then bisect between the
last that met it and the first that did not. Latencies only grow and per-user speeds only
fall as users are added, so every level past a failing one fails too.

It stops, saying why, when the objective fails (at the smallest failing level measured),
when a level has errors (a server refusing or cutting streams meets no objective), when
doubling no longer adds throughput (more users only wait longer), at the largest
concurrency allowed, or when its time budget is spent. What it measures goes to `record`
as it goes, so a search cut short keeps its points.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetbench.agent.serving.stats import describe_errors
from fleetbench.contract.serve_spec import Objective
from fleetbench.contract.wire import ServingPoint

__all__ = ["PLATEAU", "LevelFailed", "SearchResult", "search"]

# Doubling the users for less than this share more throughput: the server is saturated.
PLATEAU = 0.05


@dataclass(frozen=True)
class LevelFailed:
    """A level that gave no point, and why; `final`: no level after it can give one either
    (the server is gone, or serving others)."""

    reason: str
    final: bool = False


@dataclass(frozen=True)
class SearchResult:
    objective: str
    concurrency: int | None  # the largest measured to meet it; None: not even 1
    stop_reason: str


Measure = Callable[[int], ServingPoint | LevelFailed]


def _miss(concurrency: int, result: ServingPoint | LevelFailed, objective: Objective) -> str | None:
    """Why the level does not meet the objective (None: it does)."""
    if isinstance(result, LevelFailed):
        return f"errors at concurrency {concurrency}: {result.reason}"
    if result.errors:
        return f"errors at concurrency {concurrency}: {describe_errors(result.errors)}"
    misses = objective.misses(result)
    return f"objective failed at concurrency {concurrency}: {'; '.join(misses)}" if misses else None


def search(
    measure: Measure,
    objective: Objective,
    *,
    max_concurrency: int,
    budget_s: float,
    record: Callable[[int, ServingPoint | LevelFailed], None],
    clock: Callable[[], float] = time.monotonic,
) -> SearchResult:
    """The search (see the module); `measure` gives a level's point or why it gave none,
    `record` is told each."""
    began = clock()
    best: tuple[int, float] | None = None  # (concurrency, total tokens/s) meeting it
    failed: tuple[int, str] | None = None  # the smallest failing level, and why

    def attempt(concurrency: int) -> tuple[ServingPoint | LevelFailed, str | None]:
        result = measure(concurrency)
        record(concurrency, result)
        return result, _miss(concurrency, result, objective)

    def done(stop: str) -> SearchResult:
        return SearchResult(str(objective), best[0] if best else None, stop)

    concurrency = 1
    while True:  # doubling
        result, miss = attempt(concurrency)
        if miss is not None:
            if isinstance(result, LevelFailed) and result.final:
                return done(miss)
            failed = (concurrency, miss)
            break
        assert isinstance(result, ServingPoint)
        throughput = result.total_tps or 0.0
        if best is not None and throughput < best[1] * (1 + PLATEAU):
            previous = best
            best = (concurrency, throughput)
            return done(
                f"throughput plateau: concurrency {concurrency} gave {throughput:.1f} "
                f"tokens/s, less than {PLATEAU:.0%} over concurrency {previous[0]}'s "
                f"{previous[1]:.1f}"
            )
        best = (concurrency, throughput)
        if concurrency >= max_concurrency:
            return done(f"reached the largest concurrency allowed ({max_concurrency})")
        if clock() - began > budget_s:
            return done(f"time budget of {budget_s:g} s spent")
        concurrency = min(2 * concurrency, max_concurrency)
    while best is not None and failed[0] - best[0] > 1:  # bisecting
        if clock() - began > budget_s:
            spent = f"time budget of {budget_s:g} s spent before the bisection ended"
            return done(f"{failed[1]}; {spent}")
        middle = (best[0] + failed[0]) // 2
        result, miss = attempt(middle)
        if miss is None:
            assert isinstance(result, ServingPoint)
            best = (middle, result.total_tps or 0.0)
        elif isinstance(result, LevelFailed) and result.final:
            return done(miss)
        else:
            failed = (middle, miss)
    return done(failed[1])
