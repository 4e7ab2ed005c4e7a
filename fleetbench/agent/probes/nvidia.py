"""NVIDIA GPUs through NVML (the nvidia-ml-py package), the library nvidia-smi itself uses."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetbench.agent.probes import Collected, NoData, register

__all__ = ["NvidiaProbe", "cuda_version_text", "nvml_session"]

# NVML errors that mean "no NVIDIA GPU or driver here", as opposed to a broken one.
_ABSENT = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NotFound")


@register("nvidia")
class NvidiaProbe:
    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml  # the pynvml module; tests hand in one that replays real values

    def collect(self) -> Collected:
        with nvml_session(self._nvml) as (nvml, absent):
            if nvml is None:
                raise NoData(f"no NVIDIA driver: {absent}")
            gpus = [
                _device(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(nvml.nvmlDeviceGetCount())
            ]
            data = {
                "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
                "cuda_version": cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion_v2()),
                "gpus": gpus,
            }
        if not gpus:
            raise NoData("the NVIDIA driver reports no GPU")
        return Collected(data, identity=("driver_version", "cuda_version", "gpus"))


@contextmanager
def nvml_session(nvml: Any = None) -> Iterator[tuple[Any, str | None]]:
    """(pynvml initialised for the block, None), or (None, why) where there is no NVIDIA
    driver; any other NVML error is raised. `nvml`: the module (tests replay one)."""
    nvml = nvml or importlib.import_module("pynvml")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if type(exc).__name__ in _ABSENT:
            yield None, str(exc)
            return
        raise
    try:
        yield nvml, None
    finally:
        nvml.nvmlShutdown()


def _device(nvml: Any, handle: Any) -> dict[str, Any]:
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return _gpu_record(
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        compute_capability=(int(major), int(minor)),
        power_limit_mw=int(nvml.nvmlDeviceGetEnforcedPowerLimit(handle)),
    )


def _gpu_record(
    *,
    name: str,
    uuid: str,
    memory_bytes: int,
    compute_capability: tuple[int, int],
    power_limit_mw: int,
) -> dict[str, Any]:
    """What defines one GPU. The UUID is the card itself: a swapped card is new hardware.
    The power limit is an administrator's setting that changes what the card can do."""
    return {
        "name": name,
        "uuid": uuid,
        "memory_bytes": memory_bytes,
        "compute_capability": f"{compute_capability[0]}.{compute_capability[1]}",
        "power_limit_w": round(power_limit_mw / 1000, 1),
    }


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version as nvidia-smi prints it: 12020 -> '12.2'."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
