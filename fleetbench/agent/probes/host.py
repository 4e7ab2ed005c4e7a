"""The host: CPU, memory and operating system, read from /proc and /etc where they say it
(so that a captured machine's files give that machine's figures), else from psutil and the
platform module; and the CPUs' memory bandwidth, measured (probes/memory_probe.py)."""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from fleetbench.agent.probes import Collected, register
from fleetbench.agent.probes.memory_probe import measured_bandwidth
from fleetbench.contract.device_bandwidth import published_bandwidth
from fleetbench.contract.wire import MemoryBandwidth

__all__ = ["HostProbe", "parse_cpuinfo", "parse_meminfo", "parse_os_release"]


@register("host")
class HostProbe:
    def __init__(
        self,
        *,
        proc: Path = Path("/proc"),
        etc: Path = Path("/etc"),
        measure: Callable[[], MemoryBandwidth | None] = measured_bandwidth,
    ) -> None:
        self.proc = proc
        self.etc = etc
        self.measure = measure  # this machine's; tests of captured machines hand in theirs

    def collect(self) -> Collected:
        cpuinfo = _read(self.proc / "cpuinfo")
        cpu = parse_cpuinfo(cpuinfo) if cpuinfo else {}
        meminfo = _read(self.proc / "meminfo")
        data: dict[str, Any] = {
            "cpu_model": cpu.get("model") or platform.processor() or None,
            "cpu_sockets": cpu.get("sockets"),
            "cpu_cores": cpu.get("cores") or psutil.cpu_count(logical=False),
            "cpu_threads": cpu.get("threads") or psutil.cpu_count(logical=True),
            "memory_bytes": (meminfo and parse_meminfo(meminfo)) or psutil.virtual_memory().total,
            "os": platform.system(),
            "os_release": parse_os_release(_read(self.etc / "os-release") or ""),
            "kernel": platform.release(),
            "arch": platform.machine(),
        }
        bandwidth = self._bandwidth(data["cpu_model"], data["cpu_sockets"])
        if bandwidth is not None:
            data["bandwidth"] = bandwidth.model_dump(exclude_none=True)
        # The kernel and OS release define the machine's software as much as its hardware:
        # an upgrade of either is a change a regression may be blamed on.
        identity = (
            "cpu_model",
            "cpu_sockets",
            "cpu_cores",
            "cpu_threads",
            "memory_bytes",
            "os",
            "os_release",
            "kernel",
            "arch",
        )
        return Collected(data, identity)  # the bandwidth, measured anew, is no identity

    def _bandwidth(self, cpu_model: str | None, sockets: int | None) -> MemoryBandwidth | None:
        """What the cores reached (in a VM, a share of the sockets), else the table's peak
        of the CPU model; never a failed host probe."""
        try:
            measured = self.measure()
        except Exception:
            measured = None
        if measured is not None or not cpu_model:
            return measured
        return published_bandwidth(cpu_model, sockets=sockets)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """CPU model, sockets, physical cores (distinct socket and core ids) and threads (one
    `processor` entry each) from Linux's /proc/cpuinfo; None where it does not say."""
    model = None
    sockets: set[str] = set()
    cores: set[tuple[str, str]] = set()
    threads = 0
    socket = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "Model", "Hardware") and model is None and value:
            model = value
        elif key == "processor":
            threads += 1
        elif key == "physical id":
            sockets.add(value)
            socket = value
        elif key == "core id":
            cores.add((socket, value))
    return {
        "model": model,
        "sockets": len(sockets) or (1 if model else None),
        "cores": len(cores) or None,
        "threads": threads or None,
    }


def parse_meminfo(text: str) -> int | None:
    """MemTotal from Linux's /proc/meminfo, in bytes."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal" and value.split() and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024  # the kernel's kB are KiB
    return None


def parse_os_release(text: str) -> str | None:
    """PRETTY_NAME from /etc/os-release, e.g. 'Debian GNU/Linux 12 (bookworm)'."""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "PRETTY_NAME":
            return value.strip().strip('"') or None
    return None
