"""What a node's fingerprint says about the memory its model and KV cache must fit in.

The fingerprint's data is the probes' output (agent/probes): NVIDIA GPUs with their memory,
Apple silicon with its unified memory, the host's RAM, or a device an import named (whose
memory is not known). llama.cpp offloads to the GPUs when
there are any, so their memory is the budget; on Apple silicon Metal may use about 75% of
unified memory (its recommended working set, which llama.cpp warns past); a CPU-only node has
its RAM. AMD's probe reports no memory size, so fit is not checked there.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from fleetbench.contract.wire import AmdGpu, HardwareData, NvidiaGpu, Probes

__all__ = [
    "APPLE_GPU_SHARE",
    "DESCRIPTION_LENGTH",
    "UNKNOWN_CLASS",
    "HardwareSummary",
    "hardware_class",
    "summarize_hardware",
]

APPLE_GPU_SHARE = 0.75
DESCRIPTION_LENGTH = 300  # the column's
MemoryKind = Literal["gpu", "unified", "host"]


@dataclass(frozen=True)
class HardwareSummary:
    description: str | None  # "2x NVIDIA H100 80GB HBM3 (driver 550.54.15)"
    memory_bytes: int | None  # what the weights and KV cache must fit in
    memory_kind: MemoryKind | None


def summarize_hardware(data: dict[str, Any]) -> HardwareSummary:
    """The summary of a fingerprint's data (the shape
    fleetbench.contract.wire.HardwareData documents; data of another shape, stored before
    it was checked, has none)."""
    try:
        probes = HardwareData.model_validate(data).probes
    except ValidationError:
        return HardwareSummary(None, None, None)
    summary = _summary(probes)
    described = summary.description
    if described is not None and len(described) > DESCRIPTION_LENGTH:
        described = described[: DESCRIPTION_LENGTH - 1] + "…"
    return HardwareSummary(described, summary.memory_bytes, summary.memory_kind)


def _summary(probes: Probes) -> HardwareSummary:
    nvidia, apple, amd, host = probes.nvidia, probes.apple, probes.amd, probes.host
    if nvidia is not None and nvidia.gpus:
        sizes = [g.memory_bytes for g in nvidia.gpus]
        memory = sum(m for m in sizes if m is not None) if None not in sizes else None
        return HardwareSummary(
            _with_driver(_count_names(nvidia.gpus), nvidia.driver_version), memory, "gpu"
        )
    if apple is not None and apple.chip:
        total = apple.memory_bytes
        described = f"{apple.chip}, {_gib(total)}" if total else apple.chip
        memory = int(total * APPLE_GPU_SHARE) if total is not None else None
        return HardwareSummary(described, memory, "unified")
    if amd is not None and amd.gpus:
        return HardwareSummary(_with_driver(_count_names(amd.gpus), amd.driver_version), None, None)
    if probes.declared is not None:  # named by whoever imported a table: nothing probed
        return HardwareSummary(probes.declared.device, None, None)
    if host is not None:
        total = host.memory_bytes
        cpu = host.cpu_model or "CPU"
        described = f"{cpu}, {_gib(total)}" if total else cpu
        return HardwareSummary(described, total, "host")
    return HardwareSummary(None, None, None)


def _count_names(gpus: Sequence[NvidiaGpu | AmdGpu]) -> str:
    counts = Counter(g.name or "GPU" for g in gpus)
    return ", ".join(f"{n}x {name}" if n > 1 else name for name, n in counts.items())


def _with_driver(described: str, driver: str | None) -> str:
    return f"{described} (driver {driver})" if driver else described


def _gib(size: int | None) -> str:
    return f"{size / 2**30:.0f} GiB" if size is not None else "memory unknown"


UNKNOWN_CLASS = "unknown hardware"  # of nodes without a fingerprint, or one not described


def hardware_class(description: str | None) -> str | None:
    """The GPU or CPU model a fingerprint describes, whatever its driver: `2x NVIDIA H100
    80GB HBM3 (driver 550.54.15)` -> `2x NVIDIA H100 80GB HBM3`."""
    if description is None:
        return None
    return re.sub(r"\s*\(driver [^)]*\)", "", description).strip() or None
