"""Did a run measure the node's accelerator? A node whose fingerprint shows a GPU (NVIDIA's,
AMD's, Apple silicon's) but whose engine ran on llama.cpp's CPU backend, or offloaded no
layer (`-ngl 0`), measured its CPU: a curve placement must not take for the GPU's. Part of
the contract: the agent warns with it as the sweep ends, the registry marks the run with it
(and the node's health, and placement), from what every report already carries: its
fingerprint, the engine's backend and the settings."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from fleetbench.contract.wire import HardwareData, RunReport

__all__ = ["accelerator_of", "off_accelerator", "on_accelerator", "run_off_accelerator"]


def accelerator_of(hardware_data: dict[str, Any] | None) -> str | None:
    """The accelerator a fingerprint shows ("NVIDIA H100 80GB HBM3", "Apple M4 Pro GPU",
    "AMD Instinct MI300X"), or None: none, or a fingerprint of another shape."""
    if not hardware_data:
        return None
    try:
        probes = HardwareData.model_validate(hardware_data).probes
    except ValidationError:
        return None
    if probes.nvidia is not None and probes.nvidia.gpus:
        return probes.nvidia.gpus[0].name or "an NVIDIA GPU"
    if probes.amd is not None and probes.amd.gpus:
        return probes.amd.gpus[0].name or "an AMD GPU"
    if probes.apple is not None and probes.apple.chip:
        return f"{probes.apple.chip} GPU"
    return None


def on_accelerator(
    hardware_data: dict[str, Any] | None, backend: str | None, n_gpu_layers: int | None
) -> tuple[bool | None, str | None]:
    """(whether the run measured the node's accelerator, and if not why): None when the node
    has none or what the engine ran on is not known (an imported table without a backend
    line). The fingerprint is read once: ingest asks this of every report."""
    accelerator = accelerator_of(hardware_data)
    if accelerator is None or backend is None:
        return None, None
    if backend.strip().upper() == "CPU":
        return False, (
            f"the engine ran on llama.cpp's CPU backend on a node with {accelerator}: "
            "install llama.cpp built for it (docs/install.md)"
        )
    if n_gpu_layers == 0:
        return False, f"no layer was offloaded to {accelerator} (n_gpu_layers 0)"
    return True, None


def off_accelerator(
    hardware_data: dict[str, Any] | None, backend: str | None, n_gpu_layers: int | None
) -> str | None:
    """Why a run on a node with an accelerator measured its CPU instead, or None: it ran on
    the accelerator, the node has none, or what the engine ran on is not known."""
    return on_accelerator(hardware_data, backend, n_gpu_layers)[1]


def run_off_accelerator(report: RunReport) -> str | None:
    """off_accelerator of what a run report says."""
    hardware = report.hardware.data if report.hardware else None
    return off_accelerator(hardware, report.engine.backend, report.settings.n_gpu_layers)
