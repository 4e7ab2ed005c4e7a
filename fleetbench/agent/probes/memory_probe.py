"""The CPUs' memory bandwidth, measured: what every core together reads from a buffer far
larger than the caches (decode reads a model's weights, it does not write them).

Each worker is a process of its own, not a thread: the scan is `bytes.find` of a byte the
buffer does not hold (glibc's vectorised memchr, as fast as the memory feeds it), which
holds the GIL, and numpy (whose loops release it) is no dependency of the agent; threads
would load one core. The workers start as fresh interpreters that import nothing but this
module's standard-library imports (a fork of the agent, which may run threads, is not safe).

The figure is measured once per boot and kept (the fingerprint is taken at every sweep,
in every `fleetbench-agent` process, and the measurement costs a second or two of every
core): in the process, failure included, and in a file of the user's cache keyed by the
kernel's boot id, where there is one and it can be written. At most MAX_WORKERS workers:
fewer cores than that saturate a socket's memory channels.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the workers run this module: they import nothing they do not need
    from fleetbench.contract.wire import MemoryBandwidth

__all__ = ["BufferPlan", "measured_bandwidth", "plan_buffer"]

MIB = 1 << 20
GIB = 1 << 30
MIN_BUFFER = GIB
LLC_MULTIPLE = 4  # a buffer this many times the last-level cache: what it holds is noise
PASSES = 3
PASS_SECONDS = 0.15  # each pass scans its slice as often as fills this long (timer skew)
WORKERS_TIMEOUT_S = 20.0
MAX_WORKERS = 32
_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

_lock = threading.Lock()
_measured: list[MemoryBandwidth | None] = []  # empty until measured, then the one figure


def measured_bandwidth() -> MemoryBandwidth | None:
    """The CPUs' read bandwidth (source `measured`), measured at the first call of this
    boot and kept; None where the measurement failed (then for the whole process too) or
    where the kernel gives no boot id to keep it by (macOS, whose Apple silicon has its
    published figure)."""
    with _lock:
        if not _measured and _cache_key() is None:
            _measured.append(None)  # no boot id (macOS): it would be measured every command
        if not _measured:
            remembered = _remembered()
            if remembered is not None:
                _measured.append(remembered)
                return remembered
            try:
                found = _measure()
            except Exception:
                found = None
            _measured.append(found)
            if found is not None:
                _remember(found)
        return _measured[0]


def _cache_key() -> str | None:
    """This boot's, on this many CPUs; None where the kernel gives no boot id (macOS)."""
    try:
        return f"{_BOOT_ID.read_text().strip()}|{_cpu_count()}"
    except OSError:
        return None


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fleetbench" / "memory-bandwidth.json"


def _remembered() -> MemoryBandwidth | None:
    """The figure this boot measured already, if a process of this user kept it."""
    from fleetbench.contract.wire import MemoryBandwidth

    key = _cache_key()
    if key is None:
        return None
    try:
        kept = json.loads(_cache_file().read_text())
        return MemoryBandwidth.model_validate(kept["figure"]) if kept["key"] == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _remember(found: MemoryBandwidth) -> None:
    key = _cache_key()
    if key is None:
        return
    path = _cache_file()
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"key": key, "figure": found.model_dump(mode="json")}))
        temporary.replace(path)
    except OSError:  # an unwritable home: measured again by the next process
        temporary.unlink(missing_ok=True)


@dataclass(frozen=True)
class BufferPlan:
    """How large a buffer the probe reads, and why."""

    bytes: int
    llc_bytes: int | None
    capped: bool  # a quarter of the available memory kept it under LLC_MULTIPLE x LLC

    def describe(self) -> str:
        size = f"{self.bytes / MIB:.0f} MiB buffer"
        if self.llc_bytes is None:
            return f"{size} (last-level cache unknown)"
        llc = f"{self.llc_bytes / MIB:.0f} MiB last-level cache"
        if self.capped:
            return (
                f"{size}, capped at a quarter of available memory, under {LLC_MULTIPLE}x the {llc}"
            )
        return f"{size} ({self.bytes / self.llc_bytes:.1f}x the {llc})"


def plan_buffer(llc_bytes: int | None, available_bytes: int) -> BufferPlan:
    """LLC_MULTIPLE times the last-level cache, at least MIN_BUFFER, at most a quarter of
    the available memory (the node keeps serving while it is measured)."""
    wanted = max(MIN_BUFFER, LLC_MULTIPLE * (llc_bytes or 0))
    cap = available_bytes // 4
    size = min(wanted, cap) // MIB * MIB
    capped = llc_bytes is not None and size < LLC_MULTIPLE * llc_bytes
    return BufferPlan(bytes=size, llc_bytes=llc_bytes, capped=capped)


def last_level_cache_bytes(caches: Path = _CACHES) -> int | None:
    """The largest data or unified cache cpu0 reports in sysfs (e.g. index3/size '480M' in
    KiB or MiB units); None where sysfs does not say."""
    sizes = []
    for index in caches.glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            sizes.append(_cache_size((index / "size").read_text().strip()))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def _cache_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def _available_bytes() -> int:
    import psutil  # the agent's dependency; imported here, where it is needed

    return int(psutil.virtual_memory().available)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1


def _measure() -> MemoryBandwidth | None:
    from fleetbench.contract.wire import MemoryBandwidth

    workers = min(_cpu_count(), MAX_WORKERS)
    plan = plan_buffer(last_level_cache_bytes(), _available_bytes())
    slice_bytes = plan.bytes // workers
    if slice_bytes < MIB:
        return None
    started = time.monotonic()
    passes = _run_workers(workers, slice_bytes)
    best = max(workers * slice_bytes * reps / seconds for reps, seconds in passes)
    detail = (
        f"read (memchr scan) by {workers} processes of a {plan.describe()}, "
        f"best of {len(passes)} passes; {time.monotonic() - started:.1f} s in all"
    )
    return MemoryBandwidth(bytes_per_s=best, source="measured", detail=detail)


def _run_workers(workers: int, slice_bytes: int) -> list[tuple[int, float]]:
    """Per pass: how many times each worker scanned its slice, and the wall seconds from
    the first worker's start to the last one's end."""
    command = [sys.executable, "-m", __name__, str(slice_bytes)]
    procs: list[subprocess.Popen[str]] = []

    def kill_all() -> None:  # a worker that hangs: the parent then reads its output's end
        for proc in procs:
            proc.kill()

    watchdog = threading.Timer(WORKERS_TIMEOUT_S, kill_all)
    watchdog.start()
    try:
        for _ in range(workers):
            procs.append(
                subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            )
        # each worker fills its slice and times one scan alone: "ready <seconds>"
        first_scans = [float(_read_line(proc).split()[1]) for proc in procs]
        reps = max(1, math.ceil(PASS_SECONDS / max(max(first_scans), 1e-6)))
        for proc in procs:  # all at once: the scans overlap
            assert proc.stdin is not None
            proc.stdin.write(f"{reps} {PASSES}\n")
            proc.stdin.flush()
        # each worker then reports one "start end" per pass, on the same monotonic clock
        timings = [
            [tuple(map(float, _read_line(proc).split())) for _ in range(PASSES)] for proc in procs
        ]
        for proc in procs:
            proc.wait()
    finally:
        watchdog.cancel()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
    return [
        (
            reps,
            max(worker[n][1] for worker in timings) - min(worker[n][0] for worker in timings),
        )
        for n in range(PASSES)
    ]


def _read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a memory probe worker exited: {proc.wait()}")
    return line


def _worker(slice_bytes: int) -> None:
    """One worker: writes its slice (so that its pages exist: untouched ones all map the
    kernel's one zero page, which the caches hold), times one scan, then on the parent's
    word scans it `reps` times per pass and prints each pass's start and end."""
    buffer = b"\x00" * slice_bytes
    started = time.monotonic()
    buffer.find(b"\x01")
    print(f"ready {time.monotonic() - started:.6f}", flush=True)
    reps, passes = map(int, sys.stdin.readline().split())
    for _ in range(passes):
        started = time.monotonic()
        for _ in range(reps):
            if buffer.find(b"\x01") != -1:
                raise AssertionError("the buffer holds only zeros")
        print(f"{started:.6f} {time.monotonic():.6f}", flush=True)


if __name__ == "__main__":
    _worker(int(sys.argv[1]))
