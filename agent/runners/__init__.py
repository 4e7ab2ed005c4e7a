"""Runners: one module per engine, each measuring a sweep (the llama-batched-bench grid).

A runner gets a `SweepSpec` and reports each point as it finishes (`on_point`), so a sweep
shows progress and a crash part-way keeps what was measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agent.wire import EngineBuild, FailedPoint, Point, RunSettings

__all__ = ["PointCallback", "SweepFailed", "SweepOutcome", "SweepSpec", "needed_cells"]


@dataclass(frozen=True)
class SweepSpec:
    """The grid and the settings of a sweep, with llama-batched-bench's defaults."""

    npp: tuple[int, ...] = (128,)
    ntg: tuple[int, ...] = (128,)
    npl: tuple[int, ...] = (1, 2, 4, 8)
    n_ctx: int | None = None  # None: sized so that every point fits (see needed_cells)
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: Literal["on", "off", "auto"] = "auto"
    kv_unified: bool = False
    pp_shared: bool = False
    n_gpu_layers: int = -1
    n_threads: int | None = None  # None: the physical cores, as llama.cpp picks them
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    repeats: int = 1

    def grid(self) -> list[tuple[int, int, int]]:
        return [(pp, tg, pl) for pp in self.npp for tg in self.ntg for pl in self.npl]

    def context_size(self) -> int:
        if self.n_ctx is not None:
            return self.n_ctx
        return max(needed_cells(pp, tg, pl, self) for pp, tg, pl in self.grid())


def needed_cells(pp: int, tg: int, pl: int, spec: SweepSpec) -> int:
    """KV cells a point needs, as batched-bench computes them (n_ctx_req). Without a
    unified cache, each sequence gets an equal share of the context, so the context must
    be that many times the largest sequence."""
    if not spec.kv_unified:
        return max(spec.npl) * (pp + tg)
    return pp + pl * tg if spec.pp_shared else pl * (pp + tg)


@dataclass
class SweepOutcome:
    engine: EngineBuild
    settings: RunSettings
    points: list[Point] = field(default_factory=list)
    failures: list[FailedPoint] = field(default_factory=list)


PointCallback = Callable[[Point | FailedPoint], None]


class SweepFailed(RuntimeError):
    """The sweep could not run (or stopped): the model or context could not be created, or
    the engine's process died. `points` and `failures` hold what was measured before."""

    def __init__(
        self,
        message: str,
        points: list[Point] | None = None,
        failures: list[FailedPoint] | None = None,
    ) -> None:
        super().__init__(message)
        self.points = points or []
        self.failures = failures or []
