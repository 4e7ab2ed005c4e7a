"""Apple silicon: chip, CPU and GPU cores and unified memory, from system_profiler."""

from __future__ import annotations

import json
import platform
import re
from typing import Any

from fleetbench.agent import _proc
from fleetbench.agent.probes import Collected, NoData, register
from fleetbench.contract.device_bandwidth import published_bandwidth

__all__ = ["AppleProbe", "chip_bandwidth", "parse_system_profiler"]

COMMAND = ["system_profiler", "SPHardwareDataType", "SPDisplaysDataType", "-json"]


@register("apple")
class AppleProbe:
    def collect(self) -> Collected:
        if platform.system() != "Darwin":
            raise NoData("not macOS")
        data = parse_system_profiler(_proc.run(COMMAND, timeout=60))
        if not data.get("chip", "").startswith("Apple"):
            raise NoData(f"not Apple silicon: {data.get('chip')}")
        identity = tuple(k for k in data if k != "model_name")  # before the bandwidth
        bandwidth = chip_bandwidth(data)
        if bandwidth is None:
            return Collected(data, identity, note=f"no published bandwidth of {data['chip']}")
        return Collected({**data, "bandwidth": bandwidth}, identity)


def chip_bandwidth(data: dict[str, Any]) -> dict[str, Any] | None:
    """The chip's published peak (contract.device_bandwidth), its bin told by the GPU
    cores, as the probe's data holds it; None where the table has no single figure (a new
    chip, a virtual Mac). macOS states no memory bandwidth of its own."""
    figure = published_bandwidth(data.get("chip", ""), gpu_cores=data.get("gpu_cores"))
    return figure.model_dump(exclude_none=True) if figure is not None else None


_MEMORY = re.compile(r"^\s*([\d.]+)\s*(GB|TB|MB)\s*$")
_UNITS = {"MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def parse_system_profiler(text: str) -> dict[str, Any]:
    """The machine from `system_profiler SPHardwareDataType SPDisplaysDataType -json`."""
    report = json.loads(text)
    hardware = (report.get("SPHardwareDataType") or [{}])[0]
    gpus = [
        gpu
        for gpu in report.get("SPDisplaysDataType") or []
        if gpu.get("sppci_device_type") == "spdisplays_gpu" or "sppci_cores" in gpu
    ]
    data: dict[str, Any] = {
        "chip": hardware.get("chip_type") or hardware.get("cpu_type"),
        "model": hardware.get("machine_model"),
        "model_name": hardware.get("machine_name"),
        "memory_bytes": _bytes(hardware.get("physical_memory")),
    }
    # "proc 8:4:4": all cores, then the cores of each performance level, fastest first
    # (macOS 26 on M5: "proc 18:6:0:12"); a virtual Mac gives a plain number.
    cores = [int(n) for n in re.findall(r"\d+", str(hardware.get("number_processors", "")))]
    if cores:
        data["cpu_cores"] = cores[0]
        if len(cores) > 1:
            data["cpu_cores_by_level"] = cores[1:]
    if gpus:
        data["gpu"] = gpus[0].get("sppci_model") or gpus[0].get("_name")
        if (gpu_cores := gpus[0].get("sppci_cores")) is not None:
            data["gpu_cores"] = int(gpu_cores)
    return {k: v for k, v in data.items() if v is not None}


def _bytes(text: str | None) -> int | None:
    if text is None or (m := _MEMORY.match(text)) is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])
