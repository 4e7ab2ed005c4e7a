"""A sweep's grid and settings, with llama-batched-bench's defaults: what the agent's CLI,
a daemon's `[[sweep]]` table, a registry's sweep plan and the runners all take. Part of the
contract (fleetbench.contract), so the registry refuses a plan an agent could not run."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetbench.contract.bounds import INT32_MAX
from fleetbench.contract.kv_cache import CacheType, kv_cells
from fleetbench.contract.wire import RunSettings

__all__ = [
    "LLAMA_CPP_NAMES",
    "SCHEDULED_REPEATS",
    "Repeats",
    "SweepSpec",
    "needed_cells",
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
Repeats = Annotated[int, Field(ge=1, le=1000)] | Literal["auto"]  # N times, or until precise
# What a scheduled sweep ([[sweep]] tables, plans) repeats by default: a schedule has time
# for the precision.
SCHEDULED_REPEATS: Repeats = "auto"


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
    repeats: Repeats = Field(
        default=1,
        description="measure each point N times, or (auto) until the standard error of its "
        "S_TG is under `repeat_target`: at least 3 and at most `max_repeats` times, and no "
        "new round after `repeat_budget_s`; repeats go round the grid, so drift spreads evenly",
    )
    repeat_target: float = Field(
        default=0.015, gt=0, le=1, description="auto: the relative standard error aimed at"
    )
    max_repeats: int = Field(default=10, ge=3, le=1000, description="auto: the most repeats")
    repeat_budget_s: float = Field(
        default=900, gt=0, le=86_400, description="auto: no new round after this many seconds"
    )
    outputs: bool = Field(
        default=True,
        description="after the points, the model's outputs on fleetbench's reference text "
        "(contract.outputs: what a build's outputs are checked by; in-process, and with "
        "llama-batched-bench where the llama-server of its build is beside it)",
    )

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
