"""Runs measured under contention (agent/contention.py): the rule on figures; the watch on
this machine beside real CPU-bound processes that are not the agent's (a shell's, as a
compile job's are), and beside the agent's own engine; NVML's processes replayed; real
`fleetbench-agent sweep`s and a daemon's sweep. The suite's parallel workers keep this
machine busy whatever a test does, so the CPU figures are checked against the CPU time the
processes of a test were measured to use, never against an idle machine."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from fleetbench.agent.contention import (
    ContentionThresholds,
    ContentionWatch,
    busy_now,
    contended_warning,
    contention_reason,
    judged,
    judged_report,
)
from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.agent.serving.sweep import serve_sweep
from fleetbench.agent.sweep import measure_run
from fleetbench.contract.serve_spec import ServeSpec
from fleetbench.contract.wire import Contention
from tests.agent.serving_stub import stub_server
from tests.agent.test_probes_captured import ReplayedNVML, captured_h100
from tests.factories import a_daemon, agent

OFF = ContentionThresholds(cpu_share=1.0, gpu_processes=False)
# CPU seconds the figures may differ from the processes' own by: clock ticks, and the
# moments between the readings of the node's and the processes' times.
TOLERANCE_S = 0.25
# Spins for 60 s at most, should a test die before it kills it.
SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"


# --- the rule --------------------------------------------------------------------------


def test_a_run_is_contended_when_others_used_more_than_the_share_and_the_reason_says_so() -> None:
    figures = Contention(seconds=41, cpu_count=2, other_cpu_share=0.48, load_average_max=3.14)
    assert contention_reason(figures, ContentionThresholds(0.25, True)) == (
        "other processes used 48% of the 2 CPUs over 41 s; load average up to 3.1"
    )
    assert contention_reason(figures, ContentionThresholds(0.48, True)) is None  # not more
    assert contention_reason(figures, ContentionThresholds(0.5, True)) is None
    hour = figures.model_copy(update={"seconds": 3725.4})
    assert contention_reason(hour, ContentionThresholds(0.25, True)) == (
        "other processes used 48% of the 2 CPUs over 3725 s; load average up to 3.1"
    )
    everything = figures.model_copy(update={"other_cpu_share": 1.0})
    assert contention_reason(everything, OFF) is None  # 1: never
    unknown = figures.model_copy(update={"other_cpu_share": None})  # a server not found
    assert contention_reason(unknown, ContentionThresholds(0.0, True)) is None


def test_another_process_on_the_run_s_gpus_is_contention_where_the_setting_says() -> None:
    figures = Contention(
        seconds=12.5, cpu_count=64, other_cpu_share=0.01, gpu_processes=["4242 blender"]
    )
    assert contention_reason(figures, ContentionThresholds(0.25, True)) == (
        "other processes on its GPUs: 4242 blender"
    )
    assert contention_reason(figures, ContentionThresholds(0.25, False)) is None
    both = figures.model_copy(update={"other_cpu_share": 0.5, "load_average_max": 40.0})
    assert contention_reason(both, ContentionThresholds(0.25, True)) == (
        "other processes used 50% of the 64 CPUs over 12.5 s; other processes on its GPUs: "
        "4242 blender; load average up to 40.0"
    )


def test_judging_sets_the_reason_and_the_warning_says_what_the_registry_does() -> None:
    figures = Contention(seconds=3, cpu_count=2, other_cpu_share=0.9, load_average_max=2.0)
    marked = judged(figures, ContentionThresholds(0.25, True))
    assert marked is not None and marked.reason == (
        "other processes used 90% of the 2 CPUs over 3 s; load average up to 2.0"
    )
    assert contended_warning(marked) == (
        f"measured under contention: {marked.reason}; the registry keeps it out of "
        "placement and regression baselines; run again on an idle machine"
    )
    cleared = judged(marked, OFF)
    assert cleared is not None and cleared.reason is None and cleared.other_cpu_share == 0.9
    assert contended_warning(cleared) is None
    assert judged(None, ContentionThresholds(0.0, True)) is None  # not watched: an import


# --- the watch on this machine --------------------------------------------------------


@contextmanager
def others_spinning(count: int, code: str = SPIN) -> Iterator[list[psutil.Process]]:
    """`count` processes running `code` that are not this process's descendants (their
    parent exits at once, as a shell's jobs do), killed after."""
    with _others(count, code) as started:
        yield [process for process, _ in started]


@contextmanager
def _others(count: int, code: str) -> Iterator[list[tuple[psutil.Process, str]]]:
    """`others_spinning`, with each one's first line of output (none: '')."""
    launcher = (
        "import subprocess, sys\n"
        "prints = 'print(' in sys.argv[1]\n"
        "for _ in range(int(sys.argv[2])):\n"
        "    out = subprocess.PIPE if prints else subprocess.DEVNULL\n"
        "    p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=out,"
        " stderr=subprocess.DEVNULL, start_new_session=True)\n"
        "    print(p.pid, p.stdout.readline().decode().strip() if prints else '', flush=True)\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", launcher, code, str(count)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    processes = []
    for line in started.stdout.splitlines():
        pid, _, first = line.partition(" ")
        processes.append((psutil.Process(int(pid)), first))
    try:
        ours = {p.pid for p in psutil.Process().children(recursive=True)}
        assert not ours & {p.pid for p, _ in processes}
        time.sleep(0.3)  # spinning
        yield processes
    finally:
        for process, _ in processes:
            if process.is_running():  # the very process started, not a pid used again
                os.kill(process.pid, signal.SIGKILL)


def _cpu_s(processes: list[psutil.Process]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in processes)


def _other_cpu_s(figures: Contention) -> float:
    assert figures.other_cpu_share is not None and figures.cpu_count is not None
    return figures.other_cpu_share * figures.seconds * figures.cpu_count


def _node_busy_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq


def test_a_window_beside_cpu_bound_processes_of_others_is_contended_and_says_how_much() -> None:
    with others_spinning(psutil.cpu_count() or 1) as spinning:
        before = _cpu_s(spinning)
        with ContentionWatch() as watch:
            time.sleep(2)
        used = _cpu_s(spinning) - before
    figures = watch.figures()
    assert figures is not None
    assert figures.seconds >= 1.9 and figures.cpu_count == psutil.cpu_count()
    assert _other_cpu_s(figures) >= used - TOLERANCE_S  # every second of theirs counted
    assert figures.load_average_max is not None and figures.load_average_max > 0
    assert figures.gpu_processes == []
    reason = contention_reason(figures, ContentionThresholds(0.1, True))
    assert reason == (
        f"other processes used {figures.other_cpu_share:.0%} of the {figures.cpu_count} CPUs "
        f"over {figures.seconds:.3g} s; load average up to {figures.load_average_max:.1f}"
    )


def test_the_agent_s_own_engine_running_or_ended_is_not_another_process() -> None:
    """Children of the agent spinning (as the in-process runner's engine and the node's
    llama-batched-bench are), one of them ending and waited for inside the window: their
    CPU time is the run's own, whatever else the machine does meanwhile."""
    ends = "import time\nwhile time.process_time() < 1.0: pass"  # 1 s of CPU, then exits
    node_before = _node_busy_s()
    with ContentionWatch() as watch:
        spinning = subprocess.Popen([sys.executable, "-c", SPIN])
        try:
            subprocess.run([sys.executable, "-c", ends], check=True, timeout=60)
            time.sleep(0.5)
            own = _cpu_s([psutil.Process(spinning.pid)]) + 1.0
        finally:
            spinning.kill()
            spinning.wait()
    node_busy = _node_busy_s() - node_before
    figures = watch.figures()
    assert figures is not None
    assert _other_cpu_s(figures) <= node_busy - own + TOLERANCE_S


def _listening(port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        for c in psutil.net_connections(kind="tcp")
    )


def test_a_local_server_s_process_is_the_run_s_own_and_one_not_found_is_not_judged() -> None:
    """A serving sweep's server on this machine (another process, not the agent's child)
    spinning: its CPU time counts as the run's with `server_url`, as another's without."""
    serving = (
        "import socket, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True)\n" + SPIN
    )
    with _others(1, serving) as [(server, port)]:
        url = f"http://127.0.0.1:{port}"
        for server_url in (url, None):
            node_before, before = _node_busy_s(), _cpu_s([server])
            with ContentionWatch(server_url=server_url) as watch:
                time.sleep(1.5)
            used, node_busy = _cpu_s([server]) - before, _node_busy_s() - node_before
            figures = watch.figures()
            assert figures is not None and used > 0.5
            if server_url is None:
                assert _other_cpu_s(figures) >= used - TOLERANCE_S
            else:
                assert _other_cpu_s(figures) <= node_busy - used + TOLERANCE_S
    # killed, but not this test's child: its socket closes when the kernel has torn it down,
    # which on a busy machine is not at once
    deadline = time.monotonic() + 30
    while _listening(int(port)) and time.monotonic() < deadline:
        time.sleep(0.05)
    with ContentionWatch(server_url=url) as gone:  # here, but no process listens now
        time.sleep(0.1)
    figures = gone.figures()
    assert figures is not None and figures.other_cpu_share is None
    assert figures.load_average_max is not None and figures.seconds > 0


def test_a_serving_sweep_carries_the_figures_with_its_server_in_this_process() -> None:
    spec = ServeSpec(concurrency=(1, 2), prompt_tokens=8, gen_tokens=4, requests=4)
    with stub_server(slots=2) as stub:
        outcome = serve_sweep(stub.url, "stub", spec)
    assert [p.concurrency for p in outcome.points] == [1, 2]
    figures = outcome.contention
    assert figures is not None and figures.reason is None  # judged by the command
    assert figures.cpu_count == psutil.cpu_count() and figures.seconds > 0
    assert figures.other_cpu_share is not None and 0 <= figures.other_cpu_share <= 1


def test_a_failed_sweep_carries_the_figures_too(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    spec = SweepSpec(npp=(8,), ntg=(4,), npl=(1,))
    report = measure_run(broken, spec, LlamaCppPythonRunner(), node="n")
    assert report.status == "failed"
    assert report.contention is not None and report.contention.seconds > 0
    assert report.contention.cpu_count == psutil.cpu_count()


def test_busy_now_warns_beside_others_and_never_when_off() -> None:
    with others_spinning(psutil.cpu_count() or 1):
        assert busy_now(OFF) is None
        busy = busy_now(ContentionThresholds(0.1, True), seconds=0.5)
    assert busy is not None
    assert busy.startswith("this machine is busy: other processes used ")
    assert busy.endswith("; a run measured now may count as measured under contention")


# --- NVML replayed ----------------------------------------------------------------------


class NVMLWithProcesses(ReplayedNVML):
    """The captured H100s with the processes each runs (compute and graphics, pids)."""

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: dict[str, Any]) -> list[Any]:
        if isinstance(gpu.get("compute"), Exception):
            raise gpu["compute"]
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in gpu["compute"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: dict[str, Any]) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=None) for pid in gpu.get("graphics", [])]


def _two_h100s(**gpus: dict[str, Any]) -> NVMLWithProcesses:
    h100 = captured_h100()
    return NVMLWithProcesses(
        [{**h100.gpus[0], **gpus["gpu0"]}, {**h100.gpus[0], **gpus["gpu1"]}],
        h100.driver,
        h100.cuda,
    )


def _unused_pid() -> int:
    taken = set(psutil.pids())
    return next(pid for pid in range(max(taken) + 1000, 2**22) if pid not in taken)


def _watch_a_while(nvml: NVMLWithProcesses) -> Contention:
    with ContentionWatch(nvml=nvml, interval=0.001) as watch:
        time.sleep(0.1)
    assert nvml.shut_down
    figures = watch.figures()
    assert figures is not None
    return figures


def test_other_processes_on_the_gpus_the_run_used_are_named() -> None:
    gone = _unused_pid()
    engine = subprocess.Popen(["sleep", "60"])  # the agent's child: the engine
    try:
        with others_spinning(1) as [other]:
            nvml = _two_h100s(
                # a display server drawing on the GPU (graphics) is no competing job
                gpu0={"compute": [engine.pid, other.pid, gone], "graphics": [gone + 1]},
                gpu1={"compute": [_unused_pid() + 1]},  # a GPU the run did not use
            )
            figures = _watch_a_while(nvml)
            assert figures.gpu_processes == sorted(
                [f"{other.pid} {other.name()}", f"{gone} ?"], key=lambda p: int(p.split()[0])
            )
            on_the_cpu = _two_h100s(gpu0={"compute": [other.pid]}, gpu1={"compute": []})
            assert _watch_a_while(on_the_cpu).gpu_processes == []  # the run used no GPU
    finally:
        engine.kill()
        engine.wait()
    reason = contention_reason(figures, ContentionThresholds(1.0, True))
    assert reason is not None and f"other processes on its GPUs: {other.pid} " in reason


def test_a_reason_names_five_gpu_processes_and_fits_a_report() -> None:
    many = Contention(seconds=60, gpu_processes=[f"{pid} {'x' * 190}" for pid in range(64)])
    reason = contention_reason(many, ContentionThresholds(1.0, True))
    assert reason is not None and reason.endswith(" and 59 more")
    assert reason.count(", ") == 4
    assert Contention.model_validate({**many.model_dump(), "reason": reason}).reason == reason


def test_an_nvml_error_ends_the_gpu_watch_with_no_figure_never_the_run() -> None:
    nvml = _two_h100s(
        gpu0={"compute": [os.getpid(), 4242]},
        gpu1={"compute": ReplayedNVML.NVMLError(999)},  # NVML_ERROR_UNKNOWN
    )
    figures = _watch_a_while(nvml)
    assert figures.gpu_processes == []
    assert figures.other_cpu_share is not None  # the CPU part goes on


# --- real sweeps ---------------------------------------------------------------------------


def _sweep_json(tiny_llama: Path, tmp_path: Path, cpu_share: str) -> tuple[Any, str]:
    swept = agent(
        "sweep",
        "-m",
        str(tiny_llama),
        "--npp",
        "64",
        "--ntg",
        "16",
        "--npl",
        "1,2,4",
        "--json",
        FLEETBENCH_CONTENTION_CPU_SHARE=cpu_share,
        FLEETBENCH_CONTENTION_GPU_PROCESSES="false",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    assert swept.returncode == 0, swept.stderr
    return json.loads(swept.stdout), swept.stderr


def test_a_sweep_beside_a_cpu_bound_process_is_marked_and_warned_of(
    tiny_llama: Path, tmp_path: Path
) -> None:
    with others_spinning(psutil.cpu_count() or 1):
        report, stderr = _sweep_json(tiny_llama, tmp_path, "0.1")
    assert report["status"] == "ok"
    contention = report["contention"]
    share, cpus = contention["other_cpu_share"], contention["cpu_count"]
    assert share > 0.1 and cpus == psutil.cpu_count()
    assert contention["reason"].startswith(f"other processes used {share:.0%} of the {cpus}")
    assert "warning: this machine is busy: other processes used" in stderr
    assert f"warning: measured under contention: {contention['reason']}" in stderr
    assert "run again on an idle machine" in stderr


def test_a_sweep_with_the_threshold_off_carries_figures_and_no_reason(
    tiny_llama: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    report, stderr = _sweep_json(tiny_llama, tmp_path, "1")
    contention = report["contention"]
    assert 0 < contention["seconds"] < time.monotonic() - started
    assert contention["cpu_count"] == psutil.cpu_count()
    assert 0 <= contention["other_cpu_share"] <= 1 and contention["load_average_max"] >= 0
    assert (contention["gpu_processes"], contention["reason"]) == ([], None)
    assert "contention" not in stderr and "busy" not in stderr


def test_a_daemon_s_sweep_is_judged_by_its_settings_and_logged(
    tiny_llama: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sweep = {"name": "tiny", "model": str(tiny_llama), "cron": "0 3 * * *", "npl": [1, 2]}
    sweep |= {"npp": [32], "ntg": [8]}
    daemon = a_daemon(tmp_path, sweep, contention_cpu_share=0.1)
    kept: list[Any] = []
    daemon.delivery.keep = lambda report, _name: kept.append(report)  # type: ignore[method-assign]
    with others_spinning(psutil.cpu_count() or 1), caplog.at_level(logging.WARNING):
        assert daemon.run_sweep(daemon.config.sweeps[0], why="scheduled") == "ok"
    [report] = kept
    assert report.contention is not None and report.contention.reason is not None
    assert report.contention.reason.startswith("other processes used ")
    assert "sweep tiny measured under contention" in caplog.text
    assert report.contention.reason in caplog.text
    unjudged = report.model_copy(
        update={"contention": report.contention.model_copy(update={"reason": None})}
    )
    assert judged_report(unjudged, OFF).contention == unjudged.contention
