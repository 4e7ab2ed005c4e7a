"""NVIDIA GPUs through NVML (the nvidia-ml-py package), the library nvidia-smi itself uses."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any, TypeVar

from fleetbench.agent.probes import Collected, NoData, register
from fleetbench.contract.device_bandwidth import published_bandwidth
from fleetbench.contract.wire import DeviceMemoryUse, MemoryBandwidth

__all__ = [
    "DeviceMemoryWatch",
    "NvidiaProbe",
    "busiest_gpu_percent",
    "cuda_version_text",
    "each_gpu",
    "gpu_bandwidth",
    "gpu_memory",
    "nvml_session",
]

# NVML errors that mean "no NVIDIA GPU or driver here", as opposed to a broken one.
_ABSENT = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NotFound")


@register("nvidia")
class NvidiaProbe:
    """The driver, CUDA and each GPU (`gpus`, the identity), and each GPU's peak memory
    bandwidth (`bandwidth`, in the order of `gpus`; not identity, so the hash of a node
    fingerprinted before it was read stays the same). The list is all or nothing: where
    one GPU has no figure (NVML does not say it and the table does not list it) there is
    no list at all, and the fingerprint's note says which GPU, since a shorter list would
    pair figures with the wrong GPUs."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml  # the pynvml module; tests hand in one that replays real values

    def collect(self) -> Collected:
        with nvml_session(self._nvml) as (nvml, absent):
            if nvml is None:
                raise NoData(f"no NVIDIA driver: {absent}")
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            gpus = [_device(nvml, handle) for handle in handles]
            bandwidths = [
                gpu_bandwidth(nvml, handle, gpu["name"])
                for handle, gpu in zip(handles, gpus, strict=True)
            ]
            data: dict[str, Any] = {
                "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
                "cuda_version": cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion_v2()),
                "gpus": gpus,
            }
        if not gpus:
            raise NoData("the NVIDIA driver reports no GPU")
        identity = ("driver_version", "cuda_version", "gpus")
        missing = [f"GPU {i} ({gpus[i]['name']})" for i, b in enumerate(bandwidths) if b is None]
        if missing:
            why = "NVML does not say it and the table does not list it"
            return Collected(
                data, identity, note=f"no memory bandwidth of {', '.join(missing)}: {why}"
            )
        data["bandwidth"] = [b.model_dump(exclude_none=True) for b in bandwidths if b]
        return Collected(data, identity)


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


T = TypeVar("T")


def each_gpu(read: Callable[[Any, Any], T], nvml: Any = None) -> list[T] | None:
    """`read(nvml, gpu)` of every NVIDIA GPU; None without one, or when NVML fails (which
    is no reason to hold sweeps back: the callers' own checks say more)."""
    try:
        with nvml_session(nvml) as (session, _):
            if session is None:
                return None
            count = session.nvmlDeviceGetCount()
            return [read(session, session.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    except Exception:
        return None


def busiest_gpu_percent(nvml: Any = None) -> float | None:
    """The busiest NVIDIA GPU's utilisation now (the busy guard's question)."""
    rates = each_gpu(lambda session, gpu: session.nvmlDeviceGetUtilizationRates(gpu).gpu, nvml)
    return float(max(rates)) if rates else None


def gpu_memory(nvml: Any = None) -> list[Any] | None:
    """Each NVIDIA GPU's memory (NVML's `total`, `free`, `used`, in bytes)."""
    return each_gpu(lambda session, gpu: session.nvmlDeviceGetMemoryInfo(gpu), nvml)


_HUNG_AFTER_S = 10  # an NVML read that long is stuck, and the sweep does not wait for it


class DeviceMemoryWatch:
    """Each NVIDIA GPU's memory in use before a sweep and the most in use while it runs, read
    by a thread of its own every `interval` seconds, whichever engine runs (the node's
    llama-batched-bench tells its points only once it has exited). Inert where NVML finds
    no GPU. An NVML error ends the watch with no figure (half a sweep's readings would
    understate its peak), never the sweep; so does a sweep shorter than one interval."""

    def __init__(self, nvml: Any = None, *, interval: float = 0.5) -> None:
        self._nvml = nvml  # the pynvml module; tests hand in one that replays real values
        self._interval = interval
        self._session = ExitStack()
        self._live: Any = None  # the module while NVML is initialised and answering
        self._before: dict[int, tuple[int, int]] = {}  # gpu: (used, total)
        self._peak: dict[int, int] = {}  # gpu: used
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> DeviceMemoryWatch:
        try:
            self._live, _absent = self._session.enter_context(nvml_session(self._nvml))
        except Exception:  # a broken driver: nothing to watch
            self._live = None
        self._before = self._guarded_read()
        if self._before:
            # A thread in the agent makes the in-process runner spawn its engine's process
            # rather than fork it (runners/llama_cpp_python.py): NVML stays in this one.
            self._thread = threading.Thread(target=self._watch, name="gpu-memory", daemon=True)
            self._thread.start()
        else:
            self._end()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=_HUNG_AFTER_S)
            if self._thread.is_alive():  # an NVML call hung (a GPU off the bus): no figure
                self._before, self._peak = {}, {}
                return  # its session is the thread's to end, if it ever returns
        self._end()

    def readings(self) -> list[DeviceMemoryUse]:
        """The figures, once the watch has ended."""
        before, peak = self._before, self._peak
        try:
            return [
                DeviceMemoryUse(gpu=gpu, total_bytes=total, before_bytes=used, peak_bytes=peak[gpu])
                for gpu, (used, total) in sorted(before.items())
                if gpu in peak
            ]
        except ValueError:  # a figure no report can carry: none rather than a wrong one
            return []

    def _watch(self) -> None:
        while not self._stopped.wait(self._interval):
            for gpu, (used, _total) in self._guarded_read().items():
                self._peak[gpu] = max(used, self._peak.get(gpu, 0))

    def _guarded_read(self) -> dict[int, tuple[int, int]]:
        """Each GPU's (used, total) bytes; nothing where there is no driver, and nothing
        more after an error."""
        if self._live is None:
            return {}
        try:
            readings = {}
            for gpu in range(self._live.nvmlDeviceGetCount()):
                handle = self._live.nvmlDeviceGetHandleByIndex(gpu)
                memory = self._live.nvmlDeviceGetMemoryInfo(handle)
                readings[gpu] = (int(memory.used), int(memory.total))
            return readings
        except Exception:  # no driver, or a broken one
            self._before, self._peak = {}, {}
            self._stopped.set()
            self._end()
            return {}

    def _end(self) -> None:
        self._live = None
        with suppress(Exception):  # NVML failing to shut down costs the sweep nothing
            self._session.close()


def gpu_bandwidth(nvml: Any, handle: Any, name: str) -> MemoryBandwidth | None:
    """The GPU's peak memory bandwidth: its top memory clock x its bus width x 2 transfers
    per clock (NVML's figures; e.g. an H100 SXM's 2619 MHz x 5120 bit: 3.35 TB/s), else
    the vendor's published figure for its name, else None. NVML cannot say it on an old
    driver (NotSupported) or through a pynvml that lacks the function; a figure out of any
    GPU's range is no figure either."""
    try:
        clock_mhz = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))
        bus_bits = int(nvml.nvmlDeviceGetMemoryBusWidth(handle))
        return MemoryBandwidth(
            bytes_per_s=clock_mhz * 1e6 * bus_bits / 8 * 2,
            source="nvml",
            detail=f"{clock_mhz} MHz top memory clock x {bus_bits}-bit bus x 2 transfers per clock",
        )
    except (AttributeError, ValueError, nvml.NVMLError):  # ValueError: pydantic's bounds
        return published_bandwidth(name)


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
