"""What `/v1/prices` takes and answers."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetbench.contract.bounds import Text
from fleetbench.registry.hardware import DESCRIPTION_LENGTH, hardware_class

__all__ = ["HardwarePricePublic", "HardwarePriceRequest", "HardwarePricesPublic"]

MOST_USD_PER_HOUR = 1e6
# A hundredth of a cent an hour: below it no hardware is priced, and the cost planner's
# exact arithmetic (prices in whole units of it) stays in small integers
LEAST_USD_PER_HOUR = 1e-4


class HardwarePriceRequest(BaseModel):
    """A hardware class's price per hour, to set (replacing the one it had)."""

    model_config = ConfigDict(extra="forbid")

    hardware_class: Text = Field(
        min_length=1,
        max_length=DESCRIPTION_LENGTH,
        description="as `hardware_class` in GET /v1/nodes names it, e.g. '2x NVIDIA H100 80GB "
        "HBM3' or 'Apple M4 Pro, 48 GiB' (a node's `hardware` with its driver is taken too: "
        "the driver is left out)",
    )
    usd_per_hour: float = Field(ge=LEAST_USD_PER_HOUR, le=MOST_USD_PER_HOUR, allow_inf_nan=False)

    @field_validator("hardware_class")
    @classmethod
    def _as_classes_are_named(cls, given: str) -> str:
        named = hardware_class(given)
        if named is None:
            raise ValueError("names no hardware class")
        return named


class HardwarePricePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    hardware_class: str
    usd_per_hour: float
    set_at: datetime
    set_by: str | None = Field(
        description="the admin token that set it, or `fleetbench-registry price set`"
    )


class HardwarePricesPublic(BaseModel):
    data: list[HardwarePricePublic]
    count: int
