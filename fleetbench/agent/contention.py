"""What else used the node while a run measured, and whether that makes it a run measured
under contention (issue 39: a sweep beside a compiler measured 0.8 tokens/s where the idle
machine does 45.7, and reached the registry like any other run).

The daemon's busy guard looks before a sweep; a job may start during it. So a watch runs
beside every sweep: other processes' CPU time (the node's busy CPU time less the agent's own
process tree's, read at both ends, which needs no walk over every process), the highest
1-minute load average, and, through NVML, other processes on the GPUs the run used. The
engine the agent started is its own: the in-process runner's child, llama-batched-bench, and
for a serving sweep the server on this machine when its process can be found (its load is
what is measured). The figures travel in the report (wire.Contention); `contention_reason`
judges them against the node's thresholds, and the registry keeps a run with a reason out
of placement, regression baselines and compare's noise.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import psutil

from fleetbench.agent.probes.nvidia import nvml_session
from fleetbench.contract.wire import Contention, RunReport

if TYPE_CHECKING:
    from fleetbench.agent.config import AgentSettings

__all__ = [
    "ContentionThresholds",
    "ContentionWatch",
    "busy_now",
    "contended_warning",
    "contention_reason",
    "judged",
    "judged_report",
]

_HUNG_AFTER_S = 10  # an NVML read that long is stuck, and the sweep does not wait for it
_MAX_GPU_PROCESSES = 64  # as many as a report carries
_GPU_PROCESSES_NAMED = 5  # in a reason, which a report bounds to 1,000 characters
# What listens for a server run in a container: the server's own CPU time is not theirs
_PORT_FORWARDERS = frozenset({"docker-proxy", "rootlessport", "slirp4netns", "pasta"})


@dataclass(frozen=True)
class ContentionThresholds:
    """When a run counts as measured under contention (agent settings contention_*)."""

    cpu_share: float  # other processes' share of all CPUs above which it does (1: never)
    gpu_processes: bool  # whether another process on a GPU the run used makes it so

    @classmethod
    def of(cls, settings: AgentSettings) -> ContentionThresholds:
        return cls(settings.contention_cpu_share, settings.contention_gpu_processes)


def contention_reason(figures: Contention, thresholds: ContentionThresholds) -> str | None:
    """Why the run counts as measured under contention, naming the figures; None: it does
    not. Pure: the figures and the thresholds decide."""
    reasons = []
    share = figures.other_cpu_share
    if share is not None and share > thresholds.cpu_share:
        cpus = f" {figures.cpu_count}" if figures.cpu_count is not None else ""
        seconds = f"{figures.seconds:.0f}" if figures.seconds >= 100 else f"{figures.seconds:.3g}"
        reasons.append(f"other processes used {share:.0%} of the{cpus} CPUs over {seconds} s")
    if thresholds.gpu_processes and figures.gpu_processes:
        named = figures.gpu_processes[:_GPU_PROCESSES_NAMED]
        more = len(figures.gpu_processes) - len(named)
        listed = ", ".join(process[:60] for process in named)
        reasons.append(
            f"other processes on its GPUs: {listed}" + (f" and {more} more" if more else "")
        )
    if not reasons:
        return None
    if figures.load_average_max is not None:
        reasons.append(f"load average up to {figures.load_average_max:.1f}")
    return "; ".join(reasons)


def judged(figures: Contention | None, thresholds: ContentionThresholds) -> Contention | None:
    """`figures` with the reason this node's thresholds give them (the watch records the
    figures; whoever holds the settings, a command or the daemon, judges them)."""
    if figures is None:
        return None
    return figures.model_copy(update={"reason": contention_reason(figures, thresholds)})


def judged_report(report: RunReport, thresholds: ContentionThresholds) -> RunReport:
    """`report` with its contention `judged`."""
    return report.model_copy(update={"contention": judged(report.contention, thresholds)})


def contended_warning(figures: Contention | None) -> str | None:
    """What a command prints after a run judged as measured under contention (None: it
    was not)."""
    if figures is None or figures.reason is None:
        return None
    return (
        f"measured under contention: {figures.reason}; the registry keeps it out of "
        "placement and regression baselines; run again on an idle machine"
    )


def busy_now(thresholds: ContentionThresholds, *, seconds: float = 0.5) -> str | None:
    """What a command warns of before it starts (None: nothing): other processes' share of
    the CPUs over a short watch now above the threshold. Which GPUs the run will use is not
    known yet (the daemon's busy guard asks the GPUs' utilisation)."""
    if thresholds.cpu_share >= 1:  # never judged contended: no reason to wait for a figure
        return None
    with ContentionWatch() as watch:
        time.sleep(seconds)
    figures = watch.figures()
    reason = contention_reason(figures, thresholds) if figures is not None else None
    if reason is None:
        return None
    return (
        f"this machine is busy: {reason}; a run measured now may count as measured under contention"
    )


class ContentionWatch:
    """Other processes' use of the node while a run measures (see the module), as figures
    once the watch has ended. The CPU is read at both ends, and so is the load average;
    where NVML finds GPUs, a thread of its own reads both the load and the GPUs' processes
    every `interval` seconds (without one, the in-process runner forks its engine rather
    than spawn it: runners/llama_cpp_python.py). `server_url`: a serving
    sweep's server, whose process (where it runs here and can be found) is the run's own;
    one here that cannot be found leaves the CPU share unknown rather than blamed on it.
    An NVML error ends the GPU part of the watch, never the sweep."""

    def __init__(
        self, *, server_url: str | None = None, nvml: Any = None, interval: float = 0.5
    ) -> None:
        self._nvml = nvml  # the pynvml module; tests hand in one that replays real values
        self._interval = interval
        self._agent = psutil.Process()
        self._servers: list[psutil.Process] = []
        self._cpu_known = True
        if server_url is not None:
            self._servers, self._cpu_known = _server_processes(server_url)
        self._session = ExitStack()
        self._live: Any = None  # the NVML module while it is initialised and answering
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = self._busy_before = self._own_before = 0.0
        self._figures: Contention | None = None
        self._load_max: float | None = None
        self._own_pids: set[int] = set()  # the run's processes seen, over the whole watch
        self._gpu_pids: dict[int, set[int]] = {}  # gpu: every process seen on it
        self._names: dict[int, str] = {}  # pid: name, read while it ran

    def __enter__(self) -> ContentionWatch:
        try:
            self._live, _absent = self._session.enter_context(nvml_session(self._nvml))
        except Exception:  # no NVML library, or a broken driver: no GPU to watch
            self._live = None
        self._read_load()
        self._started = time.monotonic()
        self._busy_before, self._own_before = _busy_cpu_seconds(), self._own_cpu_seconds()
        if self._live is not None:
            self._thread = threading.Thread(target=self._watch, name="contention", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        busy, own = _busy_cpu_seconds(), self._own_cpu_seconds()
        seconds = time.monotonic() - self._started
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=_HUNG_AFTER_S)
        if self._thread is not None and self._thread.is_alive():
            # an NVML call hung (a GPU off the bus): no GPU figure; its session is the
            # thread's to end, if it ever returns
            self._gpu_pids = {}
        else:
            self._end_nvml()
        self._read_load()
        cpu_count = psutil.cpu_count() or 1
        share = None
        if self._cpu_known and seconds > 0:
            other = (busy - self._busy_before) - (own - self._own_before)
            share = round(min(1.0, max(0.0, other / (seconds * cpu_count))), 3)
        self._figures = Contention(
            seconds=round(seconds, 3),
            cpu_count=cpu_count,
            other_cpu_share=share,
            load_average_max=self._load_max,
            gpu_processes=self._other_gpu_processes(),
        )

    def figures(self) -> Contention | None:
        """The figures (reason None: judging them is `contention_reason`'s), once the watch
        has ended."""
        return self._figures

    def _watch(self) -> None:
        while not self._stopped.wait(self._interval) and self._live is not None:
            self._read_load()
            self._read_gpus()

    def _read_load(self) -> None:
        with suppress(OSError):  # no load average here: none in the figures
            load = round(psutil.getloadavg()[0], 2)
            self._load_max = max(load, self._load_max or 0.0)

    def _read_gpus(self) -> None:
        """Which processes are on each GPU now, and which of them are the run's."""
        gpu_pids = self._gpu_pids  # a hung watch's readings are dropped by replacing it
        own = {p.pid for p in self._own_processes()}
        self._own_pids |= own
        try:
            for gpu in range(self._live.nvmlDeviceGetCount()):
                handle = self._live.nvmlDeviceGetHandleByIndex(gpu)
                # compute processes alone: a display server or a browser drawing on a
                # workstation's GPU is no job competing for its memory bandwidth
                pids = {
                    int(process.pid)
                    for process in self._live.nvmlDeviceGetComputeRunningProcesses(handle)
                }
                gpu_pids.setdefault(gpu, set()).update(pids)
                for pid in pids - own - self._names.keys():
                    self._names[pid] = _process_name(pid)
        except Exception:  # no driver any more, or a broken one: no GPU figure
            gpu_pids.clear()
            self._end_nvml()

    def _other_gpu_processes(self) -> list[str]:
        """'pid name' of every other process seen on a GPU the run's processes used (a run
        on the CPU of a node with GPUs is not disturbed by their jobs)."""
        used = [pids for pids in self._gpu_pids.values() if pids & self._own_pids]
        others = sorted(set().union(*used) - self._own_pids)
        return [f"{pid} {self._names.get(pid, '?')}"[:200] for pid in others][:_MAX_GPU_PROCESSES]

    def _own_processes(self) -> list[psutil.Process]:
        """The agent's process tree and the server's, as they are now."""
        processes = []
        for root in (self._agent, *self._servers):
            with suppress(psutil.Error):  # a server gone meanwhile
                processes += [root, *root.children(recursive=True)]
        return processes

    def _own_cpu_seconds(self) -> float:
        """CPU time of the run's processes, with that of their children already waited for
        (an engine's process that has exited is counted in its parent's)."""
        return _cpu_seconds(self._own_processes())

    def _end_nvml(self) -> None:
        self._live = None
        with suppress(Exception):  # NVML failing to shut down costs the sweep nothing
            self._session.close()


def _busy_cpu_seconds() -> float:
    """The CPU time every process of the node used since boot, all CPUs together."""
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


def _cpu_seconds(processes: Iterable[psutil.Process]) -> float:
    total = 0.0
    for process in {p.pid: p for p in processes}.values():
        with suppress(psutil.Error):  # exited meanwhile: its parent counts it once waited for
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name() or "?"
    except psutil.Error:  # gone, or another user's (a container's pids): the pid says it
        return "?"


def _server_processes(url: str) -> tuple[list[psutil.Process], bool]:
    """The processes listening at `url`'s port on this machine, and whether the CPU share
    can be told: False where the server runs here but its process cannot be found (another
    user's, or a system that lists sockets to root alone)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = {
            ipaddress.ip_address(str(info[4][0]).split("%")[0])
            for info in socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
        }
        own = {
            ipaddress.ip_address(address.address.split("%")[0])
            for nics in psutil.net_if_addrs().values()
            for address in nics
            if address.family in (socket.AF_INET, socket.AF_INET6)
        }
    except (OSError, ValueError):
        return [], True  # not resolved here: the sweep finds out and says so
    if not any(address.is_loopback or address in own for address in addresses):
        return [], True  # a server elsewhere: this node's CPU is the client's alone
    try:
        listening = {
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            if c.pid is not None
        }
    except psutil.Error:
        return [], False
    found = []
    for pid in listening:
        with suppress(psutil.Error):
            found.append(psutil.Process(pid))
    with suppress(psutil.Error):
        if any(process.name() in _PORT_FORWARDERS for process in found):
            return [], False  # a server in a container: its CPU time cannot be told apart
    return found, bool(found)
