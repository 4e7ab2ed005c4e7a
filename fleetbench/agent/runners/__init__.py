"""Runners: one module per engine, each measuring a sweep (the llama-batched-bench grid) behind
one interface, `Runner`; runners.engines finds them by name.

A runner gets a `SweepSpec` (fleetbench.contract.sweep_spec: plans carry it too), reports
each point as it finishes (`on_point`) and returns a `SweepOutcome`: the engine, the
settings it ran with, the points and the failures. A sweep that stops part-way raises
`SweepFailed` with what was measured and, when the engine said, what it was measured with,
so the run is still reported whole.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fleetbench.contract.kv_cache import CacheShape, fits
from fleetbench.contract.outputs import OutputFingerprint
from fleetbench.contract.sweep_spec import LLAMA_CPP_NAMES, SweepSpec, needed_cells
from fleetbench.contract.wire import (
    AllocatedBuffer,
    EngineBuild,
    FailedPoint,
    ModelInfo,
    Point,
    RunSettings,
)

__all__ = [
    "LLAMA_CPP_NAMES",
    "PointCallback",
    "Runner",
    "StartCallback",
    "SweepFailed",
    "SweepOutcome",
    "SweepSpec",
    "Window",
    "WindowCallback",
    "needed_cells",
    "plan_grid",
    "point_from_samples",
]


Window = tuple[float, float]
"""time.monotonic() as one measurement of a point started and ended: the span the agent's
meters (agent/energy.py) read their counters over."""


@dataclass
class SweepOutcome:
    engine: EngineBuild
    settings: RunSettings
    points: list[Point] = field(default_factory=list)
    failures: list[FailedPoint] = field(default_factory=list)
    model: ModelInfo | None = None  # what the engine read from the model, when it did
    buffers: list[AllocatedBuffer] = field(default_factory=list)  # what llama.cpp allocated
    windows: dict[tuple[int, int, int], list[Window]] = field(default_factory=dict)
    """each measured point's windows, one per repeat, by (PP, TG, B)"""
    outputs: OutputFingerprint | None = None  # the model's on the reference text, if taken


def plan_grid(
    spec: SweepSpec, model: ModelInfo | None, free_bytes: int | None
) -> tuple[list[tuple[int, int, int]], list[FailedPoint], int]:
    """The points to run, those skipped because their KV cache cannot fit in `free_bytes`
    beside the weights (with the reason), and the context size: the one asked for, or the
    largest that the points to run need."""
    runnable, skipped = [], []
    for pp, tg, pl in spec.grid():
        cells = spec.n_ctx or needed_cells(pp, tg, pl, spec)
        shape = CacheShape(
            n_ctx=cells,
            n_seq=max(spec.npl),
            n_ubatch=spec.n_ubatch,
            cache_type_k=spec.cache_type_k,
            cache_type_v=spec.cache_type_v,
            unified=spec.kv_unified,
            flash_attn=spec.flash_attn,
        )  # the engine's own build: the newest rules
        reason = fits(model, shape, free_bytes=free_bytes)
        if reason is None:
            runnable.append((pp, tg, pl))
        else:
            skipped.append(FailedPoint(pp=pp, tg=tg, b=pl, reason=f"skipped: {reason}"))
    if spec.n_ctx is not None:
        return runnable, skipped, spec.n_ctx
    sizes = [needed_cells(pp, tg, pl, spec) for pp, tg, pl in runnable]
    return runnable, skipped, max(sizes, default=spec.context_size())


def point_from_samples(
    pp: int, tg: int, pl: int, n_kv: int, samples: list[tuple[float, float]], *, shared: bool
) -> Point:
    """batched-bench's formulas on the median (T_PP, T_TG) of the repeats, with the spread
    of S_PP and S_TG over them."""
    prompt_tokens = pp if shared else pl * pp
    t_pp = statistics.median(s[0] for s in samples)
    t_tg = statistics.median(s[1] for s in samples)
    s_pp_all = [prompt_tokens / s[0] for s in samples if s[0] > 0]
    s_tg_all = [pl * tg / s[1] for s in samples if s[1] > 0]
    t = t_pp + t_tg
    return Point(
        pp=pp,
        tg=tg,
        b=pl,
        n_kv=n_kv,
        t_pp=t_pp,
        s_pp=prompt_tokens / t_pp if t_pp > 0 else None,
        t_tg=t_tg,
        s_tg=pl * tg / t_tg if t_tg > 0 else None,
        t=t,
        s=(prompt_tokens + pl * tg) / t if t > 0 else None,
        repeats=len(samples),
        s_pp_stdev=statistics.stdev(s_pp_all) if len(s_pp_all) > 1 else None,
        s_tg_stdev=statistics.stdev(s_tg_all) if len(s_tg_all) > 1 else None,
    )


PointCallback = Callable[[Point | FailedPoint], None]
WindowCallback = Callable[[tuple[int, int, int], Window], None]
"""Told each measurement's window as it ends, by the point's (PP, TG, B)."""
StartCallback = Callable[[SweepOutcome], None]
"""Told the engine, settings and model (the outcome before any point) once they are known."""


class SweepFailed(RuntimeError):
    """The sweep could not run (or stopped): the model or context could not be created, or
    the engine's process died. `points` and `failures` hold what was measured before."""

    def __init__(
        self,
        message: str,
        points: list[Point] | None = None,
        failures: list[FailedPoint] | None = None,
        started: SweepOutcome | None = None,
        windows: dict[tuple[int, int, int], list[Window]] | None = None,
    ) -> None:
        super().__init__(message)
        self.points = points or []
        self.failures = failures or []
        self.started = started  # what the engine said it runs with (on_start), if it did
        self.windows = windows or {}  # the measured points' (SweepOutcome.windows)


class Runner(Protocol):
    """One engine that measures a sweep."""

    def identity(self) -> dict[str, str]:
        """What its results depend on besides the machine and the model (a version, a
        build), for the daemon's check of what changed since a sweep last succeeded."""
        ...

    def engine(self) -> EngineBuild:
        """What runs, as far as is known before it does: the engine a sweep that fails
        before its engine says is reported with."""
        ...

    def run(
        self, model_path: Path, spec: SweepSpec, *, on_point: PointCallback = ...
    ) -> SweepOutcome:
        """Measures `spec` on the model; raises SweepFailed with what it measured."""
        ...
