"""Every decode figure against the hardware's limit: memory-bandwidth utilisation (MBU).

A decode step reads the weights once (for a mixture of experts: the shared tensors and the
experts its tokens were routed to) and each sequence's KV cache up to its depth, so no
node decodes faster than its memory bandwidth over the bytes a step reads. MBU is the
share of that limit a point reached: steps per second x bytes per step / peak bandwidth,
where a step makes one token for each of B sequences (S_TG / B steps per second). At
B = 1 a well-built memory-bound node reaches most of its bandwidth; as B grows the weights
are read once for B tokens and MBU falls: the knee's physical cause.

What it cannot see: prefill (compute-bound: S_PP is never held against bandwidth),
speculative decoding (several tokens per weight read), caches that hold a small model whole
(a CPU whose last-level cache holds the weights reads them faster than its memory),
activations and scratch buffers. A point whose steps read, at the least (one token's share
of the experts), more than LIMIT of a published or driver figure cannot be true: the
model's facts, a clock or a cache is wrong, and it is kept out of the answers. A measured
figure is what a probe reached, a lower bound of the peak, so a point above it is shown,
not refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetbench.contract.device_bandwidth import published_bandwidth
from fleetbench.contract.kv_cache import kv_bytes_read
from fleetbench.contract.wire import HardwareData, MemoryBandwidth, ModelInfo, RunSettings

__all__ = [
    "LIMIT",
    "PointLimit",
    "decode_depth",
    "decode_step_bytes",
    "node_bandwidth",
    "point_limit",
]

LIMIT = 1.05  # of a device's peak: above it a decode figure cannot be true


def decode_depth(pp: int, tg: int) -> float:
    """The cells a sequence's decode step attends to on average over a point's TG steps:
    its prompt and half of what it generates."""
    return pp + (tg + 1) / 2


def decode_step_bytes(
    model: ModelInfo,
    *,
    b: int,
    pp: int,
    tg: int,
    settings: RunSettings | None = None,
    least: bool = False,
) -> float | None:
    """The bytes one decode step of `b` sequences reads at a point of PP and TG: the
    weights once, the experts the b tokens were routed to (each token picking its experts
    independently and uniformly: the expected share of a layer's experts that at least one
    of them picks; `least`: one token's share, which skewed routing cannot go under), and
    each sequence's KV cache at its mean depth (a prompt shared in a unified cache, once).
    None where the model's facts cannot say."""
    if model.weight_bytes is None:
        return None
    settings = settings or RunSettings()

    def kv(depth: float) -> float | None:
        return kv_bytes_read(
            model,
            depth,
            cache_type_k=settings.cache_type_k or "f16",
            cache_type_v=settings.cache_type_v or "f16",
            flash_attn=settings.flash_attn,
        )

    depth, prompt = kv(decode_depth(pp, tg)), kv(pp)
    if depth is None or prompt is None:
        return None
    if settings.pp_shared and settings.kv_unified:  # one copy of the prompt's cells
        caches = prompt + b * (depth - prompt)
    else:
        caches = b * depth
    experts = 0.0
    if model.expert_bytes:
        count, used = model.expert_count, model.expert_used_count
        if not count or not used:
            return None
        share = min(used, count) / count
        experts = model.expert_bytes * (share if least else 1 - (1 - share) ** b)
    return model.weight_bytes + experts + caches


@dataclass(frozen=True)
class PointLimit:
    """A point held against its node's bandwidth: its MBU (None: the facts or the peak are
    unknown) and why it cannot be true (None: it can)."""

    mbu: float | None
    impossible: str | None = None


def point_limit(
    *,
    b: int,
    pp: int,
    tg: int,
    s_tg: float | None,
    model: ModelInfo,
    settings: RunSettings,
    bandwidth: MemoryBandwidth | None,
) -> PointLimit:
    """A batched-bench point's MBU against `bandwidth`. A `-tgs` table decoded its sequences
    one after another, so each of its steps is one sequence's."""
    if s_tg is None or bandwidth is None or s_tg <= 0:
        return PointLimit(None)
    streams = 1 if settings.tg_separate else b
    step = decode_step_bytes(model, b=streams, pp=pp, tg=tg, settings=settings)
    least = decode_step_bytes(model, b=streams, pp=pp, tg=tg, settings=settings, least=True)
    if step is None or least is None:
        return PointLimit(None)
    mbu = s_tg / streams * step / bandwidth.bytes_per_s
    if not math.isfinite(mbu):
        return PointLimit(None)
    # held against the least a step can read: an estimate of routing never refuses a point
    at_least = s_tg / streams * least
    if at_least <= LIMIT * bandwidth.bytes_per_s or bandwidth.source == "measured":
        return PointLimit(mbu)
    return PointLimit(
        mbu,
        f"S_TG {s_tg:g} t/s at B={b} would read at least {at_least / 1e9:.1f} GB/s, "
        f"{at_least / bandwidth.bytes_per_s:.2f} of the device's "
        f"{bandwidth.bytes_per_s / 1e9:.0f} GB/s ({bandwidth.source}): a measurement that "
        "cannot be true (the model's facts, a clock or a cache)",
    )


def node_bandwidth(data: HardwareData, *, on_accelerator: bool | None) -> MemoryBandwidth | None:
    """The peak bandwidth a run on this hardware is held against: its GPUs' (NVML's or the
    driver's, else the published figure of their name; the fastest where there are several,
    since llama.cpp's default layer split reads each GPU's layers in turn) unless the run
    did not use them (`on_accelerator` False, contract.accelerator); Apple silicon's unified
    memory whatever the backend; the device an import named; else the CPUs' (measured,
    else published)."""
    probes = data.probes
    if on_accelerator is not False:
        for vendor in (probes.nvidia, probes.amd):
            if vendor is not None and vendor.gpus:
                found = vendor.bandwidth or [
                    known
                    for gpu in vendor.gpus
                    if gpu.name and (known := published_bandwidth(gpu.name)) is not None
                ]
                return max(found, key=lambda peak: peak.bytes_per_s) if found else None
    apple = probes.apple
    if apple is not None and apple.chip:
        return apple.bandwidth or published_bandwidth(apple.chip, gpu_cores=apple.gpu_cores)
    if probes.declared is not None:
        return published_bandwidth(probes.declared.device)
    host = probes.host
    if host is None:
        return None
    if host.bandwidth is not None:
        return host.bandwidth
    if host.cpu_model:
        return published_bandwidth(host.cpu_model, sockets=host.cpu_sockets)
    return None
