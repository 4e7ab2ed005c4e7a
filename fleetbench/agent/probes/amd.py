"""AMD GPUs, through rocm-smi (ROCm's command-line tool) where it is installed, and each
GPU's peak memory bandwidth through amd-smi, its successor, where that is installed too."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from fleetbench.agent import _proc
from fleetbench.agent.probes import Collected, NoData, register
from fleetbench.contract.device_bandwidth import published_bandwidth
from fleetbench.contract.wire import MemoryBandwidth

__all__ = ["AmdProbe", "gpu_bandwidths", "parse_amd_smi_static", "parse_rocm_smi"]

COMMAND = ["rocm-smi", "-a", "--json"]
# Its human-readable form: the form every published capture of the VRAM section has.
BANDWIDTH_COMMAND = ["amd-smi", "static", "--bus", "--vram"]


@register("amd")
class AmdProbe:
    """The driver and each GPU (`gpus`, the identity, from rocm-smi), and each GPU's peak
    memory bandwidth (`bandwidth`, in the order of `gpus`, not identity). The list is all or
    nothing, as the NVIDIA probe's: a GPU without a figure leaves no list and a note."""

    def collect(self) -> Collected:
        try:
            text = _proc.run(COMMAND, timeout=60)
        except _proc.CommandNotFound as exc:
            raise NoData("rocm-smi is not installed") from exc
        data = parse_rocm_smi(text)
        if not data["gpus"]:
            raise NoData("rocm-smi reports no GPU")
        identity = ("driver_version", "gpus")
        try:
            by_bus, why = parse_amd_smi_static(_proc.run(BANDWIDTH_COMMAND, timeout=60)), ""
        except (_proc.CommandNotFound, _proc.CommandFailed) as exc:
            by_bus, why = {}, f"{exc}; "
        bandwidths = gpu_bandwidths(data["gpus"], by_bus)
        if None in bandwidths:
            missing = [
                f"GPU {i} ({gpu['name']})"
                for i, gpu in enumerate(data["gpus"])
                if bandwidths[i] is None
            ]
            why += "amd-smi does not say it and the table does not list it"
            return Collected(
                data, identity, note=f"no memory bandwidth of {', '.join(missing)}: {why}"
            )
        data["bandwidth"] = [b.model_dump(exclude_none=True) for b in bandwidths if b]
        return Collected(data, identity)


def gpu_bandwidths(
    gpus: list[dict[str, Any]], by_bus: dict[str, MemoryBandwidth]
) -> list[MemoryBandwidth | None]:
    """Each GPU's figure, by its PCI bus (amd-smi numbers GPUs its own way): amd-smi's,
    else the table's for its name, else None."""
    return [
        by_bus.get((gpu.get("pci_bus") or "").lower()) or published_bandwidth(gpu["name"] or "")
        for gpu in gpus
    ]


_GPU = re.compile(r"^GPU: (\d+)\s*$", re.MULTILINE)
_FIELD = re.compile(r"^\s+(BDF|BIT_WIDTH|MAX_BANDWIDTH): (.+?)\s*$", re.MULTILINE)
_GB_PER_S = re.compile(r"^(\d+(?:\.\d+)?) GB/s$")
_MOST_GB_PER_S = 100_000  # past any GPU's; amd-smi has said 2**64 - 1 for "unknown"


def parse_amd_smi_static(text: str) -> dict[str, MemoryBandwidth]:
    """Each GPU's peak memory bandwidth by its PCI bus (lower case), from `amd-smi static
    --bus --vram`: the driver's MAX_BANDWIDTH (the MI300's HBM3 moves more than 2 transfers
    per memory clock, so clock x width would understate it). A GPU whose amd-smi says N/A,
    or a figure past any GPU's, has none."""
    figures = {}
    starts = [m.start() for m in _GPU.finditer(text)] + [len(text)]
    for start, end in itertools.pairwise(starts):
        fields = dict(_FIELD.findall(text[start:end]))
        rate = _GB_PER_S.match(fields.get("MAX_BANDWIDTH", ""))
        if "BDF" not in fields or rate is None or not 0 < float(rate[1]) < _MOST_GB_PER_S:
            continue
        figures[fields["BDF"].lower()] = MemoryBandwidth(
            bytes_per_s=float(rate[1]) * 1e9,
            source="amdsmi",
            detail=f"amd-smi static: MAX_BANDWIDTH {rate[1]} GB/s, "
            f"BIT_WIDTH {fields.get('BIT_WIDTH', 'N/A')}",
        )
    return figures


def parse_rocm_smi(text: str) -> dict[str, Any]:
    """What defines the machine's AMD GPUs, from `rocm-smi -a --json`: per card its name,
    GPU ID, SKU, VBIOS and power cap (never temperatures, clocks or use)."""
    report = json.loads(text)
    gpus = []
    for card, values in sorted(report.items()):
        if not card.startswith("card"):
            continue
        gpus.append(
            {
                # older rocm-smi writes "Card series", newer "Card Series"
                "name": values.get("Card Series") or values.get("Card series"),
                "gpu_id": values.get("GPU ID"),
                "sku": values.get("Card SKU"),
                "vbios": values.get("VBIOS version"),
                "power_cap_w": _number(values.get("Max Graphics Package Power (W)")),
                "pci_bus": values.get("PCI Bus"),
            }
        )
    return {"driver_version": report.get("system", {}).get("Driver version"), "gpus": gpus}


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
