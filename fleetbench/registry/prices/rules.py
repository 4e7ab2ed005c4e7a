"""The price of a million output tokens, a pure function of a class's price per hour and a
point's total decode speed: $/1M tokens = $/h / (tokens/s x 3600) x 10^6, as
kubernetes-sigs/inference-perf and InferenceMAX state it. A point's total speed, not one
user's: the node serves all B users for that hour."""

from __future__ import annotations

__all__ = ["usd_per_million_tokens"]

SECONDS_PER_HOUR = 3600


def usd_per_million_tokens(usd_per_hour: float, total_tps: float) -> float | None:
    """What a million tokens cost at `total_tps` on hardware that costs `usd_per_hour`;
    None at no speed."""
    if total_tps <= 0:
        return None
    return usd_per_hour / (total_tps * SECONDS_PER_HOUR) * 1e6
