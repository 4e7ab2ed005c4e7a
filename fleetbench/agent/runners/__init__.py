"""Runners: one module per engine, each measuring a sweep (the llama-batched-bench grid)
behind one interface, `Runner`; runners.engines finds them by name.

A runner gets a `SweepSpec`, reports each point as it finishes (`on_point`) and returns a
`SweepOutcome`: the engine, the settings it ran with, the points and the failures. A sweep
that stops part-way raises `SweepFailed` with what was measured and, when the engine said,
what it was measured with, so the run is still reported whole.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetbench.contract.bounds import INT32_MAX
from fleetbench.contract.kv_cache import CacheType, fits, kv_cells
from fleetbench.contract.wire import EngineBuild, FailedPoint, ModelInfo, Point, RunSettings

__all__ = [
    "LLAMA_CPP_NAMES",
    "PointCallback",
    "Runner",
    "StartCallback",
    "SweepFailed",
    "SweepOutcome",
    "SweepSpec",
    "needed_cells",
    "plan_grid",
    "point_from_samples",
]


# llama.cpp's long flag names where they differ from the settings they set.
LLAMA_CPP_NAMES = {
    "ctx_size": "n_ctx",
    "batch_size": "n_batch",
    "ubatch_size": "n_ubatch",
    "threads": "n_threads",
}


Sizes = Annotated[tuple[Annotated[int, Field(ge=0, le=INT32_MAX)], ...], Field(min_length=1)]
Positive = Annotated[int, Field(ge=1, le=INT32_MAX)]


class SweepSpec(BaseModel):
    """The grid and the settings of a sweep, with llama-batched-bench's defaults: what the
    CLI's options, a daemon's `[[sweep]]` table and the runners all take. Each setting is
    read by its name or by llama.cpp's long flag name, with `-` or `_` (`ctx-size`,
    `ctx_size` or `n_ctx`; `flash-attn`; `threads`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _llama_cpp_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        named: dict[Any, Any] = {}
        given: dict[Any, Any] = {}  # the key each setting was given by
        for key, value in data.items():
            name = key.replace("-", "_") if isinstance(key, str) else key
            name = LLAMA_CPP_NAMES.get(name, name)
            if name in named:
                raise ValueError(f"{given[name]!r} and {key!r} both set {name}")
            named[name], given[name] = value, key
        return named

    npp: Sizes = (128,)
    ntg: Sizes = (128,)
    npl: Annotated[tuple[Positive, ...], Field(min_length=1)] = (1, 2, 4, 8)
    n_ctx: Positive | None = Field(
        default=None,
        description="KV cells; None: sized so that every point fits (see needed_cells)",
    )
    n_batch: Positive = 2048
    n_ubatch: Positive = 512
    flash_attn: Literal["on", "off", "auto"] = "auto"
    kv_unified: bool = False
    pp_shared: bool = False
    n_gpu_layers: Annotated[int, Field(ge=-1, le=INT32_MAX, description="-1: all")] = -1
    n_threads: Positive | None = Field(
        default=None, description="None: the physical cores, as llama.cpp picks them"
    )
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    repeats: int = Field(default=1, ge=1, le=1000, description="measure each point N times")

    def grid(self) -> list[tuple[int, int, int]]:
        return [(pp, tg, pl) for pp in self.npp for tg in self.ntg for pl in self.npl]

    def run_settings(self, **taken: int | None) -> RunSettings:
        """The settings it runs with: as asked, but for what the engine took instead
        (`taken`: n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch)."""
        asked: dict[str, object] = {
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "flash_attn": self.flash_attn,
            "kv_unified": self.kv_unified,
            "pp_shared": self.pp_shared,
            "tg_separate": False,
            "n_gpu_layers": self.n_gpu_layers,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
        }
        return RunSettings.model_validate(asked | taken)

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
    return kv_cells(pp, tg, pl, shared=spec.pp_shared, unified=True)


@dataclass
class SweepOutcome:
    engine: EngineBuild
    settings: RunSettings
    points: list[Point] = field(default_factory=list)
    failures: list[FailedPoint] = field(default_factory=list)
    model: ModelInfo | None = None  # what the engine read from the model, when it did


def plan_grid(
    spec: SweepSpec, model: ModelInfo | None, free_bytes: int | None
) -> tuple[list[tuple[int, int, int]], list[FailedPoint], int]:
    """The points to run, those skipped because their KV cache cannot fit in `free_bytes`
    beside the weights (with the reason), and the context size: the one asked for, or the
    largest that the points to run need."""
    runnable, skipped = [], []
    for pp, tg, pl in spec.grid():
        cells = spec.n_ctx or needed_cells(pp, tg, pl, spec)
        reason = fits(
            model,
            n_ctx=cells,
            n_seq=max(spec.npl),
            n_ubatch=spec.n_ubatch,
            cache_type_k=spec.cache_type_k,
            cache_type_v=spec.cache_type_v,
            free_bytes=free_bytes,
        )
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
    ) -> None:
        super().__init__(message)
        self.points = points or []
        self.failures = failures or []
        self.started = started  # what the engine said it runs with (on_start), if it did


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
