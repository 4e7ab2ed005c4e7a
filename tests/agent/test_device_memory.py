"""Each NVIDIA GPU's memory in use around a sweep (agent/probes/nvidia.py DeviceMemoryWatch):
NVML replayed with the captured H100 (NVML cannot run here), and the real pynvml, which finds
no driver on this machine."""

from __future__ import annotations

from datetime import UTC, datetime

import pynvml

from fleetbench.agent.probes.nvidia import DeviceMemoryWatch
from fleetbench.agent.runners import SweepOutcome, SweepSpec
from fleetbench.agent.sweep import memory_line, run_report
from fleetbench.contract import wire
from tests.agent.test_probes_captured import captured_h100

MIB = 2**20


def test_the_most_in_use_after_any_point_is_kept_with_its_b() -> None:
    nvml = captured_h100()
    # before the sweep (the captured card: 0 MiB used), then after B = 1, 2, 8 and a second
    # round's B = 4, when the engine's scratch pool has already shrunk back a little
    nvml.gpus[0]["used_mib"] = [0, 1_500, 1_700, 2_600, 2_400]
    with DeviceMemoryWatch(nvml) as watch:
        assert nvml.shut_down  # while the agent starts its engine's process
        for b in (1, 2, 8, 4):
            watch.after_point(b)
        assert not nvml.shut_down
    assert nvml.shut_down
    assert watch.readings() == [
        wire.DeviceMemoryUse(
            gpu=0, total_bytes=81_559 * MIB, before_bytes=0, peak_bytes=2_600 * MIB, peak_b=8
        )
    ]


def test_every_gpu_is_read_and_a_sweep_without_a_point_has_no_figure() -> None:
    nvml = captured_h100()
    nvml.gpus = [
        {**nvml.gpus[0], "used_mib": [10, 4_000]},
        {**nvml.gpus[0], "uuid": "GPU-1", "used_mib": [300, 900]},
    ]
    with DeviceMemoryWatch(nvml) as both:
        both.after_point(32)
    with DeviceMemoryWatch(captured_h100()) as unread:
        pass  # the model did not load: no point was told
    assert [(r.gpu, r.before_bytes, r.peak_bytes, r.peak_b) for r in both.readings()] == [
        (0, 10 * MIB, 4_000 * MIB, 32),
        (1, 300 * MIB, 900 * MIB, 32),
    ]
    assert unread.readings() == []


def test_nvml_failing_mid_sweep_leaves_no_figure_and_the_sweep_goes_on() -> None:
    nvml = captured_h100()
    nvml.gpus[0]["used_mib"] = [0, 1_500, pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), 9]
    with DeviceMemoryWatch(nvml) as watch:
        for b in (1, 2, 4):
            watch.after_point(b)  # raises nothing
    assert watch.readings() == [] and nvml.shut_down


def test_no_driver_here_means_no_figure() -> None:
    with DeviceMemoryWatch() as watch:  # the real pynvml: no libnvidia-ml on this machine
        watch.after_point(1)
    assert watch.readings() == []


def test_a_gpu_s_memory_makes_a_version_4_report_and_a_line_of_the_cli() -> None:
    use = wire.DeviceMemoryUse(
        gpu=0,
        total_bytes=81_559 * MIB,
        before_bytes=512 * MIB,
        peak_bytes=20_480 * MIB,
        peak_b=32,
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
    assert report.schema_version == 4
    assert wire.RunReport.model_validate_json(report.model_dump_json()).device_memory == [use]
    assert memory_line(report) == "GPU0 in use: 20.0 GiB at B=32, 0.5 before the sweep, of 79.6"
