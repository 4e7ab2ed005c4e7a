"""What a node's fingerprint says about the memory its model and KV cache must fit in.

The fingerprint's data is the probes' output (agent/probes): NVIDIA GPUs with their memory,
Apple silicon with its unified memory, the host's RAM. llama.cpp offloads to the GPUs when
there are any, so their memory is the budget; on Apple silicon Metal may use about 75% of
unified memory (its recommended working set, which llama.cpp warns past); a CPU-only node has
its RAM. AMD's probe reports no memory size, so fit is not checked there.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["APPLE_GPU_SHARE", "HardwareSummary", "summarize_hardware"]

APPLE_GPU_SHARE = 0.75
MemoryKind = Literal["gpu", "unified", "host"]


@dataclass(frozen=True)
class HardwareSummary:
    description: str | None  # "2x NVIDIA H100 80GB HBM3 (driver 550.54.15)"
    memory_bytes: int | None  # what the weights and KV cache must fit in
    memory_kind: MemoryKind | None


def summarize_hardware(data: dict[str, Any]) -> HardwareSummary:
    probes: dict[str, Any] = data.get("probes") or {}
    nvidia, apple, amd, host = (probes.get(k) or {} for k in ("nvidia", "apple", "amd", "host"))
    if nvidia.get("gpus"):
        gpus = nvidia["gpus"]
        sizes = [g.get("memory_bytes") for g in gpus]
        memory = sum(sizes) if all(isinstance(m, int) for m in sizes) else None
        return HardwareSummary(
            _with_driver(_count_names(gpus), nvidia.get("driver_version")), memory, "gpu"
        )
    if apple.get("chip"):
        total = apple.get("memory_bytes")
        described = f"{apple['chip']}, {_gib(total)}" if total else str(apple["chip"])
        memory = int(total * APPLE_GPU_SHARE) if isinstance(total, int) else None
        return HardwareSummary(described, memory, "unified")
    if amd.get("gpus"):
        return HardwareSummary(
            _with_driver(_count_names(amd["gpus"]), amd.get("driver_version")), None, None
        )
    if host:
        total = host.get("memory_bytes")
        cpu = host.get("cpu_model") or "CPU"
        described = f"{cpu}, {_gib(total)}" if total else str(cpu)
        return HardwareSummary(described, total if isinstance(total, int) else None, "host")
    return HardwareSummary(None, None, None)


def _count_names(gpus: list[dict[str, Any]]) -> str:
    counts = Counter(str(g.get("name") or "GPU") for g in gpus)
    return ", ".join(f"{n}x {name}" if n > 1 else name for name, n in counts.items())


def _with_driver(described: str, driver: object) -> str:
    return f"{described} (driver {driver})" if driver else described


def _gib(size: object) -> str:
    return f"{size / 2**30:.0f} GiB" if isinstance(size, int) else "memory unknown"
