"""NVIDIA and Apple probes, which need hardware this machine lacks, on outputs captured from
real machines (tests/fixtures/probes/SOURCES.md says where each comes from)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pynvml
import pytest

from fleetbench.agent.probes import NoData
from fleetbench.agent.probes.amd import AmdProbe, parse_rocm_smi
from fleetbench.agent.probes.apple import AppleProbe, parse_system_profiler
from fleetbench.agent.probes.nvidia import NvidiaProbe, cuda_version_text

PROBES = Path(__file__).parent.parent / "fixtures" / "probes"


class ReplayedNVML:
    """pynvml's calls answered with one real machine's values (NVML cannot run here)."""

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM

    def __init__(self, gpus: list[dict[str, Any]], driver: str, cuda: int) -> None:
        self.gpus, self.driver, self.cuda = gpus, driver, cuda
        self.shut_down = False

    def nvmlInit(self) -> None:
        self.shut_down = False

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: dict[str, Any]) -> str:
        return str(gpu["name"])

    def nvmlDeviceGetUUID(self, gpu: dict[str, Any]) -> str:
        return str(gpu["uuid"])

    def nvmlDeviceGetMemoryInfo(self, gpu: dict[str, Any]) -> Any:
        # "used_mib": what each call reads in turn (the last one stays)
        readings = gpu.get("used_mib", [0])
        used = readings.pop(0) if len(readings) > 1 else readings[0]
        if isinstance(used, Exception):
            raise used
        total = gpu["memory_mib"] << 20
        return type(
            "Memory", (), {"total": total, "free": total - (used << 20), "used": used << 20}
        )

    def nvmlDeviceGetUtilizationRates(self, gpu: dict[str, Any]) -> Any:
        return type("Utilization", (), {"gpu": gpu["utilization_percent"], "memory": 0})

    def nvmlDeviceGetCudaComputeCapability(self, gpu: dict[str, Any]) -> tuple[int, int]:
        major, minor = gpu["compute_cap"].split(".")
        return int(major), int(minor)

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: dict[str, Any]) -> int:
        return int(float(gpu["power_limit_w"]) * 1000)

    def nvmlDeviceGetMaxClockInfo(self, gpu: dict[str, Any], clock: int) -> int:
        # a capture without the figure: what a driver that cannot say it answers
        if clock != pynvml.NVML_CLOCK_MEM or "max_memory_clock_mhz" not in gpu:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(gpu["max_memory_clock_mhz"])

    def nvmlDeviceGetMemoryBusWidth(self, gpu: dict[str, Any]) -> int:
        if "memory_bus_bits" not in gpu:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(gpu["memory_bus_bits"])


def captured_h100() -> ReplayedNVML:
    """The H100 of nvidia-smi-q.txt, with its compute capability from the query CSV."""
    text = (PROBES / "nvidia-smi-q.txt").read_text()

    def field(label: str) -> str:
        match = re.search(rf"^\s*{re.escape(label)}\s*: (.+)$", text, re.MULTILINE)
        assert match is not None, label
        return match.group(1).strip()

    csv = (PROBES / "nvidia-smi-query-gpu.csv").read_text().splitlines()
    header = [h.strip() for h in csv[0].split(",")]
    row = [v.strip() for v in csv[1].split(",")]
    total_mib = re.search(r"FB Memory Usage\s+Total\s+: (\d+) MiB", text)
    assert total_mib is not None
    gpu = {
        "name": field("Product Name"),
        "uuid": field("GPU UUID"),
        "memory_mib": int(total_mib.group(1)),
        "compute_cap": row[header.index("compute_cap")],
        "power_limit_w": field("Current Power Limit").removesuffix(" W"),
        "utilization_percent": int(re.findall(r"^\s*GPU\s*: (\d+) %$", text, re.MULTILINE)[0]),
    }
    major, minor = field("CUDA Version").split(".")
    return ReplayedNVML([gpu], field("Driver Version"), int(major) * 1000 + int(minor) * 10)


def test_nvidia_probe_on_a_captured_h100() -> None:
    nvml = captured_h100()
    collected = NvidiaProbe(nvml).collect()
    assert collected.data == {
        "driver_version": "590.48.01",
        "cuda_version": "13.1",
        "gpus": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                "memory_bytes": 81559 << 20,
                "compute_capability": "9.0",
                "power_limit_w": 700.0,
            }
        ],
        # this replay has no bus width (nvidia-smi does not print it): the table's figure
        "bandwidth": [
            {
                "bytes_per_s": 3.35e12,
                "source": "table",
                "detail": "NVIDIA H100 80GB HBM3: https://www.nvidia.com/en-us/data-center/h100/"
                " (H100 SXM, H100 NVL)",
            }
        ],
    }
    assert set(collected.identity) == {"driver_version", "cuda_version", "gpus"}
    assert nvml.shut_down


def test_nvidia_probe_on_a_captured_rtx4090() -> None:
    _, row = (PROBES / "nvidia-smi-query-gpu-rtx4090.csv").read_text().splitlines()
    name, memory, driver, compute_cap, power = (v.strip() for v in row.split(","))
    gpu = {
        "name": name,
        "uuid": "GPU-rtx4090",
        "memory_mib": int(memory.removesuffix(" MiB")),
        "compute_cap": compute_cap,
        "power_limit_w": power.removesuffix(" W"),
    }
    [record] = NvidiaProbe(ReplayedNVML([gpu], driver, 13000)).collect().data["gpus"]
    assert (record["name"], record["memory_bytes"], record["compute_capability"]) == (
        "NVIDIA GeForce RTX 4090",
        24564 << 20,
        "8.9",
    )
    assert record["power_limit_w"] == 450.0


def test_nvidia_probe_lists_every_gpu_and_a_swapped_card_is_new_hardware() -> None:
    one = captured_h100()
    two = ReplayedNVML(
        [one.gpus[0], {**one.gpus[0], "uuid": "GPU-11111111-1111-1111-1111-111111111111"}],
        one.driver,
        one.cuda,
    )
    assert [g["uuid"][-4:] for g in NvidiaProbe(two).collect().data["gpus"]] == ["0000", "1111"]


def test_cuda_version_text() -> None:
    assert [cuda_version_text(v) for v in (12020, 13010, 11080)] == ["12.2", "13.1", "11.8"]


def test_no_nvidia_driver_here_is_no_data_not_a_failure() -> None:
    # This machine has no NVIDIA driver: the real pynvml cannot find libnvidia-ml.
    with pytest.raises(NoData, match="no NVIDIA driver"):
        NvidiaProbe().collect()


def _system_profiler(hardware: str) -> str:
    combined = json.loads((PROBES / hardware).read_text())
    combined.update(json.loads((PROBES / "apple-system-profiler-displays.json").read_text()))
    return json.dumps(combined)


def test_apple_m1_with_the_m1_pro_displays_capture() -> None:
    data = parse_system_profiler(_system_profiler("apple-system-profiler-hardware.json"))
    assert data == {
        "chip": "Apple M1",
        "model": "MacBookAir10,1",
        "model_name": "MacBook Air",
        "memory_bytes": 16 << 30,
        "cpu_cores": 8,
        "cpu_cores_by_level": [4, 4],
        "gpu": "Apple M1 Pro",  # the displays capture is of another Mac (SOURCES.md)
        "gpu_cores": 14,
    }


def test_apple_m5_max_reports_three_performance_levels() -> None:
    data = parse_system_profiler((PROBES / "apple-system-profiler-hardware-m5max.json").read_text())
    assert (data["chip"], data["memory_bytes"]) == ("Apple M5 Max", 128 << 30)
    assert (data["cpu_cores"], data["cpu_cores_by_level"]) == (18, [6, 0, 12])


def test_apple_virtual_mac_gives_a_plain_core_count() -> None:
    data = parse_system_profiler(
        (PROBES / "apple-system-profiler-hardware-virtual.json").read_text()
    )
    assert (data["chip"], data["cpu_cores"], data["memory_bytes"]) == (
        "Apple M1 (Virtual)",
        3,
        7 << 30,
    )
    assert "cpu_cores_by_level" not in data


def test_apple_probe_on_linux_is_no_data() -> None:
    with pytest.raises(NoData, match="not macOS"):
        AppleProbe().collect()


def test_amd_probe_reads_a_captured_mi250() -> None:
    data = parse_rocm_smi((PROBES / "rocm-smi-a.json").read_text())
    assert data == {
        "driver_version": "6.2.4",
        "gpus": [
            {
                "name": "AMD INSTINCT MI250 (MCM) OAM AC MBA",
                "gpu_id": "0x740c",
                "sku": "D65209",
                "vbios": "113-D65209-073",
                "power_cap_w": 560.0,
                "pci_bus": "0000:2F:00.0",
            }
        ],
    }


def test_no_rocm_smi_here_is_no_data() -> None:
    with pytest.raises(NoData, match="rocm-smi is not installed"):
        AmdProbe().collect()
