"""A serving sweep's load, limits and objective: what `serve-sweep`'s options, a daemon's
`[[serve_sweep]]` table and a registry's serving plan all take. Part of the contract
(fleetbench.contract), so the registry refuses a plan an agent could not run.

An objective (`--slo "ttft_p90<=2000ms,tps_per_user_p10>=10"`) bounds figures of a serving
point (contract.wire.ServingPoint): latencies from above, speeds from below, so that a
concurrency that fails it is failed by every larger one too (what the SLO search bisects on).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetbench.contract.bounds import MAX_FIGURE
from fleetbench.contract.wire import ServingPoint

__all__ = ["OBJECTIVE_METRICS", "Bound", "Objective", "ObjectiveText", "ServeSpec", "ServerUrl"]

# An objective's metric -> (the ServingPoint field, its unit, whether it is a latency).
OBJECTIVE_METRICS: dict[str, tuple[str, str, bool]] = {
    **{f"ttft_p{q}": (f"ttft_ms_p{q}", "ms", True) for q in (50, 90, 99)},
    **{f"itl_p{q}": (f"itl_ms_p{q}", "ms", True) for q in (50, 90, 99)},
    **{f"e2e_p{q}": (f"e2e_ms_p{q}", "ms", True) for q in (50, 90, 99)},
    **{f"tps_per_user_p{q}": (f"per_user_tps_p{q}", "tokens/s", False) for q in (10, 50, 90)},
    "total_tps": ("total_tps", "tokens/s", False),
}
_BOUND = re.compile(
    r"^\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*(ms|s|t/s)?\s*$"
)


@dataclass(frozen=True)
class Bound:
    """One bound of an objective: `metric op value` (latencies in ms, speeds in tokens/s)."""

    metric: str
    op: Literal["<=", "<", ">=", ">"]
    value: float

    def __str__(self) -> str:
        unit = "ms" if OBJECTIVE_METRICS[self.metric][2] else ""
        # 15 significant digits: what the text said, read back as the same number
        return f"{self.metric}{self.op}{self.value:.15g}{unit}"

    def miss(self, point: ServingPoint) -> str | None:
        """Why the point misses this bound, or None when it meets it."""
        field, unit, _ = OBJECTIVE_METRICS[self.metric]
        measured: float | None = getattr(point, field)
        if measured is None:
            return f"{self.metric} not measured (no request completed)"
        met = {
            "<=": measured <= self.value,
            "<": measured < self.value,
            ">=": measured >= self.value,
            ">": measured > self.value,
        }[self.op]
        if met:
            return None
        against = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[self.op]
        return f"{self.metric} {measured:,.1f} {unit} {against} {self.value:,g} {unit}"


@dataclass(frozen=True)
class Objective:
    """Bounds every one of which a point must meet."""

    bounds: tuple[Bound, ...]

    @classmethod
    def parse(cls, text: str) -> Objective:
        """`ttft_p90<=2000ms,tps_per_user_p10>=10`: comma-separated bounds; latencies take
        `ms` (the default) or `s`, speeds tokens/s. Raises ValueError naming what is wrong."""
        bounds = []
        for part in text.split(","):
            if not part.strip():
                continue
            found = _BOUND.match(part.lower())
            if found is None:
                raise ValueError(
                    f"{part.strip()!r} is not a bound such as ttft_p90<=2000ms or "
                    "tps_per_user_p10>=10"
                )
            metric, op, number, unit = found.groups()
            if metric not in OBJECTIVE_METRICS:
                raise ValueError(
                    f"{metric!r} is no objective metric; use one of {', '.join(OBJECTIVE_METRICS)}"
                )
            latency = OBJECTIVE_METRICS[metric][2]
            if latency and op not in ("<=", "<"):
                raise ValueError(f"{metric} is a latency: give an upper bound (<=)")
            if not latency and op not in (">=", ">"):
                raise ValueError(f"{metric} is a speed: give a lower bound (>=)")
            if unit is not None and (unit == "t/s") == latency:
                raise ValueError(f"{metric} is not measured in {unit}")
            value = float(number) * (1000 if unit == "s" else 1)
            if not value <= MAX_FIGURE:  # what the figures it bounds can be at most
                raise ValueError(f"{part.strip()[:60]!r}: at most {MAX_FIGURE:g}")
            bounds.append(Bound(metric, op, value))  # type: ignore[arg-type]
        if not bounds:
            raise ValueError("an objective needs at least one bound, e.g. ttft_p90<=2000ms")
        if len({b.metric for b in bounds}) != len(bounds):
            raise ValueError(f"a metric is bounded twice in {text!r}")
        return cls(tuple(bounds))

    def __str__(self) -> str:
        return ",".join(str(b) for b in self.bounds)

    def misses(self, point: ServingPoint) -> list[str]:
        """Why the point misses the objective (empty: it meets it)."""
        return [why for bound in self.bounds if (why := bound.miss(point)) is not None]


def _normal_objective(text: str) -> str:
    return str(Objective.parse(text))


ObjectiveText = Annotated[str, Field(max_length=500), AfterValidator(_normal_objective)]
"""An objective as text, checked and written the one way (`ttft_p90<=2000ms`)."""


def _server_url(url: str) -> str:
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: give the server's base URL, without a query or fragment")
    return parts.geturl().rstrip("/")


ServerUrl = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_server_url)]
"""A server's base URL (http or https, a path prefix allowed), without the trailing slash."""

Level = Annotated[int, Field(ge=1, le=4096)]


class ServeSpec(BaseModel):
    """The load of a serving sweep: the concurrencies (or, with `slo`, a search for the
    largest that meets it), prompt and output lengths, requests or seconds per concurrency,
    and the bounds on every wait."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: tuple[Level, ...] = Field(default=(1, 2, 4, 8), min_length=1, max_length=64)
    prompt_tokens: int = Field(default=512, ge=1, le=1_000_000)
    gen_tokens: int = Field(default=128, ge=1, le=1_000_000)
    requests: int | None = Field(
        default=None, ge=1, le=1_000_000, description="per concurrency [default: 4 C, >= 8]"
    )
    duration_s: float | None = Field(
        default=None, gt=0, le=86_400, description="seconds per concurrency, instead of requests"
    )
    first_token_timeout_s: float = Field(
        default=60.0, ge=0.1, le=3600, description="to the first token, and between two"
    )
    request_timeout_s: float = Field(default=600.0, ge=1, le=86_400)
    slo: ObjectiveText | None = Field(
        default=None,
        description="search for the largest concurrency meeting this objective instead of "
        "measuring `concurrency`: double from 1 until it fails, then bisect",
    )
    max_concurrency: Level = Field(default=256, description="the SLO search goes no higher")
    search_budget_s: float = Field(
        default=3600.0, gt=0, le=86_400, description="the SLO search stops past this"
    )
    outputs: bool = Field(
        default=True,
        description="after the levels, the model's outputs on fleetbench's reference text "
        "(contract.outputs), where the server is a llama-server",
    )

    @model_validator(mode="after")
    def _requests_or_duration(self) -> ServeSpec:
        if self.requests is not None and self.duration_s is not None:
            raise ValueError("give requests or duration_s per concurrency, not both")
        return self

    @field_validator("concurrency")
    @classmethod
    def _each_once(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(levels)) != len(levels):
            raise ValueError(f"a concurrency is given twice: {list(levels)}")
        return levels

    def objective(self) -> Objective | None:
        return Objective.parse(self.slo) if self.slo is not None else None
