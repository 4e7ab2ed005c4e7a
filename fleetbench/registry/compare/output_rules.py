"""When have a model's outputs changed beyond what its hardware itself varies by? The bars
compare's verdict on a new build (compare.outputs) and the regression judge's output shifts
(regressions.output_shifts) both hold outputs to. Pure functions over compared fingerprints
(contract.outputs).

The **floor** is the largest difference seen where nothing should have changed: its mean KL
divergence and its p99. Outputs changed beyond it where positions' logits newly hold no
numbers (NaN, inf), where the mean KL is above both FLOOR_FACTOR x the floor's and `min_kl`,
or where the p99 is above both FLOOR_FACTOR x the floor's p99 and P99_FACTOR x `min_kl` (a
kernel wrong on one kind of token moves a few positions far and the mean little).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from fleetbench.contract.outputs import OutputDifference, OutputFingerprint

__all__ = [
    "FLOOR_FACTOR",
    "MIN_KL",
    "OUTPUT_SETTINGS",
    "P99_FACTOR",
    "Floor",
    "beyond_floor",
    "floor_of",
    "newly_non_finite",
    "outputs_runner",
]

FLOOR_FACTOR = 2.0
MIN_KL = 0.01  # nats: `min_kl` unless configured (FLEETBENCH_COMPARE_OUTPUTS_MIN_KL)
P99_FACTOR = 10.0  # the p99's bar, in min_kl: a few positions moved far
# A run's settings that change what its model outputs (the device, the attention kernel,
# the KV cache's precision): fingerprints differing in any of them never compare.
OUTPUT_SETTINGS = ("n_gpu_layers", "flash_attn", "cache_type_k", "cache_type_v")


def outputs_runner(kind: str, runner: str, settings: Any) -> str:
    """What fingerprints compare within: the kind of run (a server's against a server's),
    what ran the model (engine, backend, binding: `runner`) and its OUTPUT_SETTINGS, of
    `settings` (a run row)."""
    shaped = " ".join(f"{name}={getattr(settings, name)}" for name in OUTPUT_SETTINGS)
    return f"{kind} {runner} {shaped}"


class Floor(NamedTuple):
    """The most outputs differ where nothing changed: mean KL and p99 (nats)."""

    mean_kl: float
    p99_kl: float


def floor_of(differences: Iterable[OutputDifference]) -> Floor:
    """The floor the differences show (0 where there are none: any change above `min_kl`
    is then beyond it)."""
    seen = list(differences)
    return Floor(
        max((d.mean_kl for d in seen), default=0.0), max((d.p99_kl for d in seen), default=0.0)
    )


def beyond_floor(difference: OutputDifference, floor: Floor, min_kl: float) -> bool:
    """Whether the KL divergence moved beyond the floor (the mean's bar or the p99's)."""
    return difference.mean_kl > max(FLOOR_FACTOR * floor.mean_kl, min_kl) or (
        difference.p99_kl > max(FLOOR_FACTOR * floor.p99_kl, P99_FACTOR * min_kl)
    )


def newly_non_finite(base: OutputFingerprint, new: OutputFingerprint) -> int:
    """Positions whose logits hold no numbers in `new` beyond those `base` had: any is a
    change, whatever the floor."""
    return new.non_finite - base.non_finite
