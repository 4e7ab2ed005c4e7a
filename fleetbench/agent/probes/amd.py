"""AMD GPUs, through rocm-smi (ROCm's command-line tool) where it is installed."""

from __future__ import annotations

import json
from typing import Any

from fleetbench.agent import _proc
from fleetbench.agent.probes import Collected, NoData, register

__all__ = ["AmdProbe", "parse_rocm_smi"]

COMMAND = ["rocm-smi", "-a", "--json"]


@register("amd")
class AmdProbe:
    def collect(self) -> Collected:
        try:
            text = _proc.run(COMMAND, timeout=60)
        except _proc.CommandNotFound as exc:
            raise NoData("rocm-smi is not installed") from exc
        data = parse_rocm_smi(text)
        if not data["gpus"]:
            raise NoData("rocm-smi reports no GPU")
        return Collected(data, identity=("driver_version", "gpus"))


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
