"""Each NVIDIA GPU's memory in use around a sweep (agent/probes/nvidia.py DeviceMemoryWatch):
NVML replayed with the captured H100 (NVML cannot run here), and the real pynvml, which finds
no driver on this machine."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pynvml
import pytest

from fleetbench.agent.probes.nvidia import (
    DeviceMemoryWatch,
    busiest_gpu_percent,
    gpu_memory,
    nvml_session,
)
from fleetbench.agent.runners import SweepOutcome, SweepSpec
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner, _process_context
from fleetbench.agent.sweep import measure_run, memory_line, run_report
from fleetbench.contract import wire
from tests.agent.test_probes_captured import captured_h100
from tests.agent.tiny_gguf import write_tiny_llama

MIB = 2**20


def _until_read(*gpus: dict[str, Any]) -> None:
    """Waits for the watch's thread to read every reading the replayed GPUs hold."""
    deadline = time.monotonic() + 10
    while any(len(gpu["used_mib"]) > 1 for gpu in gpus):
        assert time.monotonic() < deadline, "the watch stopped reading"
        time.sleep(0.005)
    time.sleep(0.05)  # the last reading taken in


def test_the_most_in_use_while_the_sweep_runs_is_kept() -> None:
    nvml = captured_h100()
    # before the sweep (the captured card: 0 MiB used), then the model, the context at
    # growing B, and the scratch pool shrinking back a little at the end
    nvml.gpus[0]["used_mib"] = [0, 600, 1_500, 2_600, 2_400]
    with DeviceMemoryWatch(nvml, interval=0.001) as watch:
        _until_read(nvml.gpus[0])
        assert not nvml.shut_down
    assert nvml.shut_down
    assert watch.readings() == [
        wire.DeviceMemoryUse(
            gpu=0, total_bytes=81_559 * MIB, before_bytes=0, peak_bytes=2_600 * MIB
        )
    ]


def test_every_gpu_is_read_and_a_sweep_shorter_than_a_reading_has_no_figure() -> None:
    nvml = captured_h100()
    nvml.gpus = [
        {**nvml.gpus[0], "used_mib": [10, 4_000, 3_000]},
        {**nvml.gpus[0], "uuid": "GPU-1", "used_mib": [300, 900]},
    ]
    with DeviceMemoryWatch(nvml, interval=0.001) as both:
        _until_read(*nvml.gpus)
    with DeviceMemoryWatch(captured_h100(), interval=60) as unread:
        pass  # over before the first reading
    assert [(r.gpu, r.before_bytes, r.peak_bytes) for r in both.readings()] == [
        (0, 10 * MIB, 4_000 * MIB),
        (1, 300 * MIB, 900 * MIB),
    ]
    assert unread.readings() == []


def test_nvml_failing_mid_sweep_leaves_no_figure_and_the_sweep_goes_on() -> None:
    nvml = captured_h100()
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml.gpus[0]["used_mib"] = [0, 1_500, lost, 2_000, 9]
    with DeviceMemoryWatch(nvml, interval=0.001) as watch:
        deadline = time.monotonic() + 10
        while not nvml.shut_down:  # the watch ends itself on the error
            assert time.monotonic() < deadline
            time.sleep(0.005)
    assert watch.readings() == []
    assert nvml.gpus[0]["used_mib"] == [2_000, 9]  # nothing read after the error


def test_the_agent_spawns_its_engine_while_nvml_is_watched() -> None:
    """NVML stays in the agent's process: with the watch's thread running, the in-process
    runner spawns its engine's process rather than fork it."""
    with DeviceMemoryWatch(captured_h100(), interval=60):
        watching = [t.name for t in threading.enumerate() if t.name == "gpu-memory"]
        during = _process_context().get_start_method()
    assert (watching, during) == (["gpu-memory"], "spawn")
    assert "gpu-memory" not in [t.name for t in threading.enumerate()]


def test_no_driver_means_no_figure_and_no_thread() -> None:
    with nvml_session() as (nvml, _absent):
        if nvml is not None:
            pytest.skip("this machine has an NVIDIA driver")
    with DeviceMemoryWatch(interval=0.001) as watch:  # the real pynvml: no libnvidia-ml
        assert "gpu-memory" not in [t.name for t in threading.enumerate()]
    assert watch.readings() == []


def test_a_sweep_reports_its_gpus_memory_measured_or_failed(tmp_path: Path) -> None:
    """measure_run around a real in-process sweep of the tiny llama, and around one whose
    model llama.cpp cannot load: both reports carry what the watch read."""
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    spec = SweepSpec(npp=(8,), ntg=(4,), npl=(1, 2), n_ctx=64)
    reports = []
    for path in (model, broken):
        nvml = captured_h100()
        nvml.gpus[0]["used_mib"] = [100, 700, 1_300, 900]
        watch = DeviceMemoryWatch(nvml, interval=0.001)
        reports.append(
            measure_run(path, spec, LlamaCppPythonRunner(), node="h100", gpu_memory=watch)
        )
    measured, failed = reports
    assert (measured.status, failed.status) == ("ok", "failed")
    assert "could not load" in (failed.error or "")
    for report in reports:
        assert [(u.before_bytes, u.peak_bytes) for u in report.device_memory] == [
            (100 * MIB, 1_300 * MIB)
        ]


def test_a_gpu_s_memory_makes_a_report_s_device_memory_and_a_line_of_the_cli() -> None:
    use = wire.DeviceMemoryUse(
        gpu=0, total_bytes=81_559 * MIB, before_bytes=512 * MIB, peak_bytes=20_480 * MIB
    )
    point = wire.Point(pp=128, tg=32, b=32, n_kv=5_120, t_pp=0.5, s_pp=8_192, t_tg=1, s_tg=1_024)
    report = run_report(
        node="h100",
        model=wire.ModelInfo(name="m"),
        spec=SweepSpec(npp=(128,), ntg=(32,), npl=(32,)),
        started_at=datetime.now(UTC),
        outcome=SweepOutcome(wire.EngineBuild(), wire.RunSettings(), points=[point]),
        device_memory=[use],
    )
    assert wire.RunReport.model_validate_json(report.model_dump_json()).device_memory == [use]
    assert memory_line(report) == "GPU0 in use: 20.0 GiB at most, 0.5 before the sweep, of 79.6"


def test_the_busy_guard_and_the_fit_checks_read_nvml_in_one_place() -> None:
    """agent/probes/nvidia.py's readers, on the captured H100 (idle: 0 %) doubled: the
    busiest GPU's load, the first GPU's free memory, every GPU's memory in all; None where
    NVML fails or finds no driver (the real pynvml here)."""
    nvml = captured_h100()
    assert busiest_gpu_percent(nvml) == 0.0
    nvml.gpus = [
        {**nvml.gpus[0], "used_mib": [1_000]},
        {**nvml.gpus[0], "uuid": "GPU-1", "utilization_percent": 75},
    ]
    assert busiest_gpu_percent(nvml) == 75.0
    memory = gpu_memory(nvml)
    assert memory is not None and memory[0].free == (81_559 - 1_000) * MIB
    assert sum(gpu.total for gpu in memory) == 2 * 81_559 * MIB
    nvml.gpus[0]["used_mib"] = [pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)]
    assert gpu_memory(nvml) is None
    with nvml_session() as (real, _absent):
        if real is not None:
            pytest.skip("this machine has an NVIDIA driver")
    assert (busiest_gpu_percent(), gpu_memory()) == (None, None)
