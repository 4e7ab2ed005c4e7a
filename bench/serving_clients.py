"""What bench/serving_compare.py's clients share: the load they are given, where they run
(pinned to a core or not), and how a client process is run so that all its CPU time is
counted, its descendants' included."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

__all__ = [
    "CLIENT_CORE",
    "OFFLINE",
    "PINNED",
    "SERVER_CORE",
    "UNPINNED",
    "Child",
    "Placement",
    "Run",
    "Workload",
    "become_subreaper",
    "run_child",
    "with_cpu",
]

SERVER_CORE, CLIENT_CORE = 0, 1
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class Workload:
    concurrency: int
    prompt_tokens: int
    gen_tokens: int
    requests: int  # counted, after `concurrency` warm-up requests


@dataclass(frozen=True)
class Placement:
    """Where the clients run: core 1 (the server has core 0), or anywhere."""

    name: str
    client_cores: str | None

    def pinned(self, command: Sequence[str]) -> list[str]:
        if self.client_cores is None:
            return list(command)
        return ["taskset", "-c", self.client_cores, *command]


PINNED = Placement("pinned", str(CLIENT_CORE))
UNPINNED = Placement("unpinned", None)


@dataclass
class Run:
    client: str
    placement: str
    figures: dict[str, float]


@dataclass(frozen=True)
class Child:
    """A client process that has ended: what it printed, its CPU and wall seconds."""

    stdout: str
    stderr: str
    cpu_s: float
    wall_s: float


def become_subreaper() -> None:
    """Descendants of a client orphaned before it exits are handed to this process rather
    than to init, so that their CPU time still reaches RUSAGE_CHILDREN when reaped here."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


_PR_SET_CHILD_SUBREAPER = 36


def run_child(command: Sequence[str], env: dict[str, str], timeout_s: float) -> Child:
    """Runs `command` in a session of its own and waits for it; its CPU time is what
    getrusage(RUSAGE_CHILDREN) gained: the process and every descendant, reaped by its parent
    or, orphaned, by this process (become_subreaper). A descendant still alive when the
    command exits would escape that count: it is killed, and the run refused."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_session(process.pid)
        process.communicate()
        raise SystemExit(f"{shlex.join(command)} ran past {timeout_s:.0f} s") from None
    wall = time.perf_counter() - started
    left = _session(process.pid)
    if left:
        _kill_session(process.pid)
        names = ", ".join(sorted({p.name() for p in left}))
        raise SystemExit(f"{command[0]} left processes running ({names}): CPU not all counted")
    _reap_orphans(process.pid)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise SystemExit(
            f"{shlex.join(command)} exited with {process.returncode}:\n{stderr[-3000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Child(stdout, stderr, cpu, wall)


def _reap_orphans(sid: int) -> None:
    """Waits for the exited descendants of session `sid` handed to this process."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if os.getsid(child.pid) == sid or child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, 0)


def _session(sid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def _kill_session(sid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)
    for process in _session(sid):
        with contextlib.suppress(psutil.Error):
            process.kill()


def with_cpu(figures: dict[str, float], child: Child, load: Workload) -> dict[str, float]:
    """The client's cost: its whole process's CPU (start-up, warm-up and the counted
    requests), per counted request and as a share of a core per stream over its wall time."""
    return {
        **figures,
        "cpu_s": child.cpu_s,
        "wall_s": child.wall_s,
        "cpu_ms_per_request": 1000 * child.cpu_s / load.requests,
        "cpu_pct_per_stream": 100 * child.cpu_s / child.wall_s / load.concurrency,
    }
