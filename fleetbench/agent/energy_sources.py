"""The energy counters agent/energy.py reads: NVIDIA's (NVML), AMD's (amdsmi) and the CPUs'
(Linux powercap, RAPL). Each is found once, checked by one reading, then read by the meter's
thread until it fails; Apple's IOReport is not read."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, Protocol

from fleetbench.agent.probes.nvidia import nvml_session
from fleetbench.contract.energy import EnergySource

__all__ = [
    "Counter",
    "amdsmi_counter",
    "nvml_counter",
    "rapl_counter",
    "visible_gpus",
]

SCOPE_LENGTH = 200  # RunEnergy.scope's bound


class Counter(Protocol):
    """One source's counter: each device's cumulative joules, and the devices' summed
    instantaneous watts where the source has such a reading (None otherwise)."""

    source: EnergySource
    scope: str
    update_period_s: float  # how often the hardware refreshes the counter

    def read(self) -> tuple[tuple[float, ...], float | None]: ...

    def close(self) -> None: ...


def nvml_counter(nvml: Any = None) -> Counter | None:
    """The NVIDIA GPUs the run can use, or None: no driver, an NVML that fails, or a GPU
    counted that has no energy counter (older than Volta: NotSupported), since a sum that
    leaves a board out would understate the run."""
    session = ExitStack()
    try:
        live, _absent = session.enter_context(nvml_session(nvml))
        if live is None:
            session.close()
            return None
        uuids = [
            _text(live.nvmlDeviceGetUUID(live.nvmlDeviceGetHandleByIndex(i)))
            for i in range(live.nvmlDeviceGetCount())
        ]
        counted = sorted(visible_gpus(uuids, os.environ.get("CUDA_VISIBLE_DEVICES")))
        handles = [live.nvmlDeviceGetHandleByIndex(i) for i in counted]
        if not handles:
            session.close()
            return None
        for handle in handles:
            live.nvmlDeviceGetTotalEnergyConsumption(handle)
        names = [_text(live.nvmlDeviceGetName(handle)) for handle in handles]
        try:
            for handle in handles:
                live.nvmlDeviceGetPowerUsage(handle)
            with_watts = True
        except live.NVMLError:  # no instantaneous power: the counter alone
            with_watts = False
        return _NvmlCounter(live, session, handles, _boards(counted, names), with_watts)
    except Exception:  # NotSupported, or a driver that fails: no source
        with suppress(Exception):
            session.close()
        return None


def visible_gpus(uuids: Sequence[str], cuda_visible: str | None) -> list[int]:
    """The NVML indices of the GPUs a CUDA program sees: all where CUDA_VISIBLE_DEVICES is
    unset, else those it names by index or by (a unique prefix of) UUID, up to the first
    entry that names none, as CUDA reads it. An index is taken as NVML's, which is CUDA's
    where the GPUs are alike (both then order them by PCI bus)."""
    if cuda_visible is None:
        return list(range(len(uuids)))
    counted: list[int] = []
    for entry in (part.strip() for part in cuda_visible.split(",")):
        if entry.isdigit() and int(entry) < len(uuids):
            found = [int(entry)]
        else:
            found = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
        if len(found) != 1 or found[0] in counted:
            break
        counted.append(found[0])
    return counted


class _NvmlCounter:
    source: EnergySource = "nvml"
    update_period_s = 0.1

    def __init__(
        self, nvml: Any, session: ExitStack, handles: list[Any], scope: str, with_watts: bool
    ) -> None:
        self._nvml, self._session, self._handles = nvml, session, handles
        self.scope, self._with_watts = scope, with_watts

    def read(self) -> tuple[tuple[float, ...], float | None]:
        nvml = self._nvml
        joules = tuple(nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3 for h in self._handles)
        if not self._with_watts:
            return joules, None
        try:  # a cross-check only: a power read that fails costs the counter nothing
            return joules, sum(nvml.nvmlDeviceGetPowerUsage(h) for h in self._handles) / 1e3
        except nvml.NVMLError:
            return joules, None

    def close(self) -> None:
        with suppress(Exception):  # NVML failing to shut down costs the sweep nothing
            self._session.close()


def amdsmi_counter(amdsmi: Any = None) -> Counter | None:
    """The AMD GPUs a HIP program sees (HIP_VISIBLE_DEVICES, else ROCR_VISIBLE_DEVICES, by
    index; else all) through the amdsmi package, or None: no package, no GPU, or a GPU
    without an energy counter (a virtual machine's guest)."""
    try:
        amdsmi = amdsmi or importlib.import_module("amdsmi")
    except Exception:  # not installed, or its library is missing
        return None
    try:
        amdsmi.amdsmi_init()
    except Exception:
        return None
    try:
        every = list(amdsmi.amdsmi_get_processor_handles())
        seen = os.environ.get("HIP_VISIBLE_DEVICES", os.environ.get("ROCR_VISIBLE_DEVICES"))
        counted = visible_gpus([""] * len(every), seen)  # by index: no UUIDs to match
        handles = [every[i] for i in counted]
        if not handles:
            raise LookupError("no AMD GPU")
        names = [_amd_name(amdsmi, handle) for handle in handles]
        counter = _AmdsmiCounter(amdsmi, handles, _boards(counted, names))
        counter.read()  # a counter that fails now (a virtual machine's guest) is none
        return counter
    except Exception:
        with suppress(Exception):
            amdsmi.amdsmi_shut_down()
        return None


class _AmdsmiCounter:
    source: EnergySource = "amdsmi"
    update_period_s = 0.1

    def __init__(self, amdsmi: Any, handles: list[Any], scope: str) -> None:
        self._amdsmi, self._handles, self.scope = amdsmi, handles, scope

    def read(self) -> tuple[tuple[float, ...], float | None]:
        joules = tuple(_amd_joules(self._amdsmi.amdsmi_get_energy_count(h)) for h in self._handles)
        try:  # a cross-check only: a power read that fails costs the counter nothing
            watts = [_amd_watts(self._amdsmi.amdsmi_get_power_info(h)) for h in self._handles]
        except Exception:
            return joules, None
        return joules, None if None in watts else sum(w for w in watts if w is not None)

    def close(self) -> None:
        with suppress(Exception):
            self._amdsmi.amdsmi_shut_down()


def _amd_joules(count: dict[str, Any]) -> float:
    """The accumulator x its resolution (microjoules per count); ROCm before 6.4 calls the
    accumulator `power`, later ones `energy_accumulator`."""
    accumulator = count["energy_accumulator"] if "energy_accumulator" in count else count["power"]
    return float(accumulator) * float(count["counter_resolution"]) / 1e6


def _amd_watts(info: dict[str, Any]) -> float | None:
    """The socket's current power, else its average (watts); amdsmi says "N/A" for none."""
    for key in ("current_socket_power", "average_socket_power"):
        if isinstance(info.get(key), int | float):
            return float(info[key])
    return None


def _amd_name(amdsmi: Any, handle: Any) -> str:
    try:
        return str(amdsmi.amdsmi_get_gpu_asic_info(handle)["market_name"]) or "AMD GPU"
    except Exception:
        return "AMD GPU"


_PACKAGE_ZONE = re.compile(r"intel-rapl:(\d+)")
_SUBZONE = re.compile(r"(intel-rapl:\d+):\d+")
_PACKAGE_NAME = re.compile(r"package-(\d+)(?:-die-\d+)?")  # a die: a zone of its own


def rapl_counter(powercap: Path) -> Counter | None:
    """The CPU packages' counters (`intel-rapl:N` named `package-M`; AMD's CPUs expose the
    same tree) and their DRAM subzones, or None where a package's counter is unreadable:
    root-only since Linux 5.10 (CVE-2020-8694). Core and uncore are inside the package and
    psys holds it, so neither is counted; the `intel-rapl-mmio` zones repeat the packages."""
    try:
        zones = {entry.name: entry for entry in powercap.iterdir()}
    except OSError:
        return None
    packages: dict[str, int] = {}  # zone: package number (its name's, not the zone's)
    for zone_name, zone in zones.items():
        named = _PACKAGE_NAME.fullmatch(_name_of(zone))
        if _PACKAGE_ZONE.fullmatch(zone_name) and named:
            packages[zone_name] = int(named[1])
    domains: list[_RaplDomain] = []
    for zone_name in packages:
        domain = _RaplDomain.at(zones[zone_name])
        if domain is None:
            return None
        domains.append(domain)
    with_dram: list[int] = []
    for zone_name, zone in sorted(zones.items()):
        parent = _SUBZONE.fullmatch(zone_name)
        if not parent or parent[1] not in packages or _name_of(zone) != "dram":
            continue
        domain = _RaplDomain.at(zone)
        if domain is not None:  # an unreadable DRAM counter leaves the DRAM out
            domains.append(domain)
            with_dram.append(packages[parent[1]])
    if not domains:
        return None
    return _RaplCounter(domains, _cpu_scope(sorted(set(packages.values())), sorted(set(with_dram))))


def _cpu_scope(packages: list[int], with_dram: list[int]) -> str:
    numbers = ", ".join(map(str, packages))
    text = f"CPU package{'s' if len(packages) > 1 else ''} {numbers}"
    if with_dram == packages:
        return f"{text} and {'their' if len(packages) > 1 else 'its'} DRAM"
    if with_dram:
        return f"{text} and the DRAM of package{'s' if len(with_dram) > 1 else ''} " + ", ".join(
            map(str, with_dram)
        )
    return text


class _RaplDomain:
    """One zone's counter, unwrapped: a reading lower than the one before wrapped once."""

    def __init__(self, energy: Path, range_uj: int, first_uj: int) -> None:
        self._energy, self._range_uj = energy, range_uj
        self._last_uj, self._wraps_uj = first_uj, 0

    @classmethod
    def at(cls, zone: Path) -> _RaplDomain | None:
        try:
            range_uj = int((zone / "max_energy_range_uj").read_text())
            first_uj = int((zone / "energy_uj").read_text())
        except (OSError, ValueError):  # unreadable (root-only), missing, or not a number
            return None
        return cls(zone / "energy_uj", range_uj, first_uj) if range_uj > 0 else None

    def joules(self) -> float:
        now_uj = int(self._energy.read_text())
        if now_uj < self._last_uj:
            self._wraps_uj += self._range_uj
        self._last_uj = now_uj
        return (now_uj + self._wraps_uj) / 1e6


class _RaplCounter:
    source: EnergySource = "rapl"
    update_period_s = 0.001  # the MSRs refresh every millisecond

    def __init__(self, domains: list[_RaplDomain], scope: str) -> None:
        self._domains, self.scope = domains, scope

    def read(self) -> tuple[tuple[float, ...], float | None]:
        return tuple(domain.joules() for domain in self._domains), None

    def close(self) -> None:
        """Nothing stays open: each read opens the files anew."""


def _name_of(zone: Path) -> str:
    try:
        return (zone / "name").read_text().strip()
    except OSError:
        return ""


def _boards(indices: Sequence[int], names: Sequence[str]) -> str:
    """'GPU board: 0 (NVIDIA H100 80GB HBM3)', 'GPU boards: 0, 1 (NVIDIA H100 80GB HBM3)', or
    each board with its name where they differ; the names left out past the bound."""
    label = "GPU board" if len(indices) == 1 else "GPU boards"
    if len(set(names)) == 1:
        text = f"{label}: {', '.join(map(str, indices))} ({names[0]})"
    else:
        text = f"{label}: " + ", ".join(
            f"{i} ({name})" for i, name in zip(indices, names, strict=True)
        )
    return text if len(text) <= SCOPE_LENGTH else f"{label}: {', '.join(map(str, indices))}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
