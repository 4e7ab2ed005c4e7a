"""What a run's points cost in energy, as the node measured it: part of the wire format
(contract.wire re-exports it; a module of its own because it is one thing).

A figure covers the devices its `source` counts and nothing else: an NVIDIA or AMD GPU's
board (not the host, the cooling or the facility), or a CPU's packages and, where the
kernel exposes it, their DRAM (`scope` says which). A point's energy spans its whole
measurement, prefill and decode, so its tokens per joule are its generated tokens (B x TG)
over those joules, as InferenceX counts a benchmark window's.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetbench.contract.bounds import Figure, Text

__all__ = [
    "ENERGY_SOURCES",
    "EnergySource",
    "PointEnergy",
    "RunEnergy",
    "joules_per_token",
    "tokens_per_joule",
]

EnergySource = Literal["nvml", "amdsmi", "rapl", "ioreport"]
"""nvml: NVIDIA's total energy counter (millijoules since the driver loaded, Volta and
newer); amdsmi: AMD's energy accumulator; rapl: the Linux powercap counters of Intel and AMD
CPUs; ioreport: Apple silicon's energy model (not read yet: it is named so that an agent that
reads it needs no new wire format)."""

ENERGY_SOURCES: tuple[EnergySource, ...] = ("nvml", "amdsmi", "rapl", "ioreport")

INVALID_LENGTH = 500
LEAST_JOULES = 1e-3


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class RunEnergy(_Part):
    """Where a run's energy figures come from and what they cover."""

    source: EnergySource
    scope: Annotated[Text, Field(min_length=1, max_length=200)] = Field(
        description="the devices counted, e.g. 'GPU board: 0 (NVIDIA H100 80GB HBM3)' or "
        "'CPU packages 0, 1 and their DRAM'"
    )


class PointEnergy(_Part):
    """The energy the run's counted devices drew while one point was measured: the median
    over its repeats of each repeat's window (prefill and decode). A counter that did not
    advance, went back, or advanced too coarsely for the window's length gives no joules
    and says why in `invalid`: never a 0 that would read as free tokens."""

    joules: Annotated[Figure, Field(ge=LEAST_JOULES)] | None = Field(
        default=None,
        description="None where `invalid` says why; at least a millijoule (a window spans ten "
        "of the counter's reads, and no device draws less)",
    )
    seconds: Figure = Field(description="the window the joules were counted over (a repeat's)")
    watts_sampled: Figure | None = Field(
        default=None,
        description="the mean of the devices' instantaneous power read over the window, as a "
        "cross-check of the counter (None: the source has no such reading)",
    )
    invalid: Annotated[Text, Field(min_length=1, max_length=INVALID_LENGTH)] | None = None

    @model_validator(mode="after")
    def _joules_or_why_not(self) -> PointEnergy:
        if (self.joules is None) == (self.invalid is None):
            raise ValueError("a point's energy has either joules or the reason it has none")
        return self


def tokens_per_joule(b: int, tg: int, joules: float | None) -> float | None:
    """A point's generated tokens (B x TG) per joule; None without a figure (or one that is
    no number: a stored row older than the wire's floor)."""
    if joules is None or joules <= 0 or b * tg <= 0:
        return None
    per_joule = b * tg / joules
    return per_joule if math.isfinite(per_joule) else None


def joules_per_token(b: int, tg: int, joules: float | None) -> float | None:
    """A point's joules per generated token; None without a figure."""
    per_joule = tokens_per_joule(b, tg, joules)
    return None if per_joule is None else 1 / per_joule
