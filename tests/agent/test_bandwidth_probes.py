"""Each device's peak memory bandwidth in the fingerprint: NVML's clocks and bus width
replayed from captured outputs of real GPUs, amd-smi's figure from a captured output, the
table for Apple silicon, and the CPUs' bandwidth measured on this machine
(tests/fixtures/probes/SOURCES.md says where each capture comes from)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetbench.agent import _proc
from fleetbench.agent.fingerprint import fingerprint_of
from fleetbench.agent.probes import (
    PROBES,
    Collected,
    ProbeResult,
    memory_probe,
    register,
    run_probes,
)
from fleetbench.agent.probes.amd import AmdProbe, gpu_bandwidths, parse_amd_smi_static
from fleetbench.agent.probes.apple import chip_bandwidth, parse_system_profiler
from fleetbench.agent.probes.host import HostProbe
from fleetbench.agent.probes.memory_probe import last_level_cache_bytes, plan_buffer
from fleetbench.agent.probes.nvidia import NvidiaProbe
from fleetbench.contract.wire import MemoryBandwidth
from tests.agent.test_probes_captured import ReplayedNVML, captured_h100

PROBES_DIR = Path(__file__).parent.parent / "fixtures" / "probes"
MIB = 1 << 20
GIB = 1 << 30


def _device_query(name: str) -> tuple[str, int, int]:
    """(GPU name, memory clock MHz, bus width bits) of a captured deviceQuery's device 0:
    CUDA reads both from the driver NVML reads them from."""
    text = (PROBES_DIR / name).read_text()
    gpu = re.search(r'^Device 0: "(.+)"$', text, re.MULTILINE)
    clock = re.search(r"Memory Clock rate:\s+(\d+) Mhz", text)
    bus = re.search(r"Memory Bus Width:\s+(\d+)-bit", text)
    assert gpu and clock and bus, name
    return gpu[1], int(clock[1]), int(bus[1])


def _replayed(name: str, clock_mhz: int | None, bus_bits: int | None) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        **captured_h100().gpus[0],
        "name": name,
        "uuid": f"GPU-{name}",
    }
    if clock_mhz is not None:
        gpu["max_memory_clock_mhz"] = clock_mhz
    if bus_bits is not None:
        gpu["memory_bus_bits"] = bus_bits
    return gpu


def test_h100_peak_from_its_captured_max_memory_clock_and_bus_width() -> None:
    smi_q = (PROBES_DIR / "nvidia-smi-q.txt").read_text()
    max_clocks = re.search(r"Max Clocks\n(?:.*\n)*?\s+Memory\s+: (\d+) MHz", smi_q)
    assert max_clocks is not None
    name, _, bus_bits = _device_query("nvidia-devicequery-h100.txt")
    nvml = captured_h100()
    nvml.gpus[0].update(max_memory_clock_mhz=int(max_clocks[1]), memory_bus_bits=bus_bits)
    collected = NvidiaProbe(nvml).collect()
    assert name == collected.data["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    [bandwidth] = collected.data["bandwidth"]
    assert bandwidth == {
        "bytes_per_s": 2619e6 * 5120 / 8 * 2,  # 3.352 TB/s, NVIDIA's "3.35 TB/s"
        "source": "nvml",
        "detail": "2619 MHz top memory clock x 5120-bit bus x 2 transfers per clock",
    }
    assert "bandwidth" not in collected.identity and collected.note is None


@pytest.mark.parametrize(
    ("capture", "peak", "published"),
    [
        ("nvidia-devicequery-rtx4090.txt", 10501e6 * 384 / 8 * 2, 1008e9),
        ("nvidia-devicequery-a100-sxm4-80gb.txt", 1593e6 * 5120 / 8 * 2, 2039e9),
        ("nvidia-devicequery-h100.txt", 2619e6 * 5120 / 8 * 2, 3350e9),
    ],
)
def test_nvml_peak_of_captured_gpus_is_the_vendor_s_figure(
    capture: str, peak: float, published: float
) -> None:
    name, clock_mhz, bus_bits = _device_query(capture)
    nvml = ReplayedNVML([_replayed(name, clock_mhz, bus_bits)], "550.54.15", 12040)
    [bandwidth] = NvidiaProbe(nvml).collect().data["bandwidth"]
    assert (bandwidth["bytes_per_s"], bandwidth["source"]) == (peak, "nvml")
    assert bandwidth["bytes_per_s"] == pytest.approx(published, rel=2e-3)


def test_an_old_driver_s_gpu_gets_the_table_s_figure_by_its_name() -> None:
    name, clock_mhz, _ = _device_query("nvidia-devicequery-a100-sxm4-80gb.txt")
    nvml = ReplayedNVML([_replayed(name, clock_mhz, None)], "470.57.02", 11040)
    [bandwidth] = NvidiaProbe(nvml).collect().data["bandwidth"]
    assert (bandwidth["bytes_per_s"], bandwidth["source"]) == (2039e9, "table")


def test_a_pynvml_without_the_bus_width_function_gets_the_table_s_figure() -> None:
    class OldPynvml(ReplayedNVML):
        nvmlDeviceGetMemoryBusWidth = None  # type: ignore[assignment]

        def __getattribute__(self, attr: str) -> Any:
            if attr == "nvmlDeviceGetMemoryBusWidth":
                raise AttributeError(attr)
            return super().__getattribute__(attr)

    name, clock_mhz, bus_bits = _device_query("nvidia-devicequery-rtx4090.txt")
    collected = NvidiaProbe(
        OldPynvml([_replayed(name, clock_mhz, bus_bits)], "525.60.13", 12000)
    ).collect()
    assert [(b["bytes_per_s"], b["source"]) for b in collected.data["bandwidth"]] == [
        (1008e9, "table")
    ]


def test_one_gpu_without_any_figure_leaves_no_list_and_a_note() -> None:
    """A list with a hole would pair the figures with the wrong GPUs."""
    name, clock_mhz, bus_bits = _device_query("nvidia-devicequery-h100.txt")
    unknown = _replayed("NVIDIA Graphics Device", None, None)  # a new card, an old driver
    nvml = ReplayedNVML([_replayed(name, clock_mhz, bus_bits), unknown], "590.48.01", 13010)
    collected = NvidiaProbe(nvml).collect()
    assert "bandwidth" not in collected.data
    assert collected.note is not None and "GPU 1 (NVIDIA Graphics Device)" in collected.note
    assert "GPU 0" not in collected.note


def test_bandwidth_leaves_the_fingerprint_hash_of_an_existing_node_unchanged() -> None:
    name, clock_mhz, bus_bits = _device_query("nvidia-devicequery-h100.txt")
    nvml = ReplayedNVML([_replayed(name, clock_mhz, bus_bits)], "590.48.01", 13010)
    collected = NvidiaProbe(nvml).collect()
    before = {k: v for k, v in collected.data.items() if k != "bandwidth"}  # an older agent
    now = fingerprint_of([ProbeResult("nvidia", True, collected)])
    then = fingerprint_of([ProbeResult("nvidia", True, Collected(before, collected.identity))])
    assert now.hash == then.hash
    assert now.data["probes"]["nvidia"]["bandwidth"][0]["source"] == "nvml"
    assert "bandwidth" not in then.data["probes"]["nvidia"]


def test_a_probe_s_note_reaches_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleetbench.agent.probes.PROBES", dict(PROBES))

    @register("noted", default_enabled=False)
    class Noted:
        def collect(self) -> Collected:
            return Collected({"gpus": ["x"]}, ("gpus",), note="no memory bandwidth of GPU 0 (x)")

    [result] = run_probes(["noted"])
    fingerprint = fingerprint_of([result])
    assert fingerprint.data["notes"] == {"noted": "no memory bandwidth of GPU 0 (x)"}
    assert fingerprint.data["complete"] is True  # a missing figure is no failed probe


def test_amd_smi_static_of_a_captured_mi300a() -> None:
    figures = parse_amd_smi_static((PROBES_DIR / "amd-smi-static-mi300a.txt").read_text())
    assert figures == {
        "0000:01:00.0": MemoryBandwidth(
            bytes_per_s=5325e9,
            source="amdsmi",
            detail="amd-smi static: MAX_BANDWIDTH 5325 GB/s, BIT_WIDTH 8192",
        )
    }
    # its memory clock's top level, 1300 MHz x 8192 bit x 2, would say half of it
    assert figures["0000:01:00.0"].bytes_per_s / 1.9 > 1300e6 * 8192 / 8 * 2


def test_amd_smi_without_a_figure_gives_none() -> None:
    captured = (PROBES_DIR / "amd-smi-static-mi300a.txt").read_text()
    not_available = captured.replace("MAX_BANDWIDTH: 5325 GB/s", "MAX_BANDWIDTH: N/A")
    unknown = captured.replace("5325 GB/s", "18446744073709551615 GB/s")  # amd-smi's -1
    assert parse_amd_smi_static(not_available) == {}
    assert parse_amd_smi_static(unknown) == {}


def test_amd_gpus_get_amd_smi_s_figure_by_pci_bus_else_the_table_s() -> None:
    by_bus = parse_amd_smi_static((PROBES_DIR / "amd-smi-static-mi300a.txt").read_text())
    gpus = [
        {"name": "AMD Instinct MI300X", "pci_bus": "0000:0C:00.0"},  # not in amd-smi's list
        {"name": "AMD Instinct MI300A", "pci_bus": "0000:01:00.0"},
        {"name": "AMD INSTINCT MI250 (MCM) OAM AC MBA", "pci_bus": "0000:2F:00.0"},
    ]
    figures = gpu_bandwidths(gpus, by_bus)
    assert [(f.bytes_per_s, f.source) if f else None for f in figures] == [
        (5300e9, "table"),
        (5325e9, "amdsmi"),
        None,
    ]


def test_amd_probe_without_amd_smi_keeps_its_gpus_and_notes_the_bandwidth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rocm_smi = (PROBES_DIR / "rocm-smi-a.json").read_text()

    def run(argv: list[str], **_: Any) -> str:
        if argv[0] == "amd-smi":
            raise _proc.CommandNotFound("amd-smi is not installed")
        return rocm_smi

    monkeypatch.setattr(_proc, "run", run)
    collected = AmdProbe().collect()
    assert collected.data["gpus"][0]["pci_bus"] == "0000:2F:00.0"
    assert "bandwidth" not in collected.data
    assert collected.note == (
        "no memory bandwidth of GPU 0 (AMD INSTINCT MI250 (MCM) OAM AC MBA): amd-smi is not "
        "installed; amd-smi does not say it and the table does not list it"
    )
    assert collected.identity == ("driver_version", "gpus")


def test_apple_chip_bandwidth_from_the_table() -> None:
    m1 = parse_system_profiler((PROBES_DIR / "apple-system-profiler-hardware.json").read_text())
    assert chip_bandwidth(m1) == {
        "bytes_per_s": 68.25e9,
        "source": "table",
        "detail": "Apple M1: https://support.apple.com/kb/SP854 (M1), SP858 (M1 Pro/Max), "
        "SP869 (M1 Ultra)",
    }
    m3_max = {"chip": "Apple M3 Max", "gpu_cores": 30}
    assert (chip_bandwidth(m3_max) or {}).get("bytes_per_s") == 300e9
    assert (chip_bandwidth({**m3_max, "gpu_cores": 40}) or {}).get("bytes_per_s") == 400e9
    virtual = parse_system_profiler(
        (PROBES_DIR / "apple-system-profiler-hardware-virtual.json").read_text()
    )
    assert chip_bandwidth(virtual) is None  # "Apple M1 (Virtual)": no published figure


def _host(tmp_path: Path, model: str, sockets: int) -> Path:
    cpuinfo = "".join(
        f"processor\t: {n}\nmodel name\t: {model}\nphysical id\t: {n}\ncore id\t\t: 0\n\n"
        for n in range(sockets)
    )
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    (tmp_path / "meminfo").write_text("MemTotal:       67108864 kB\n")
    return tmp_path


def test_host_probe_gives_the_measured_figure_out_of_its_identity(tmp_path: Path) -> None:
    measured = MemoryBandwidth(bytes_per_s=123e9, source="measured", detail="a probe's")
    proc = _host(tmp_path, "AMD EPYC 9654 96-Core Processor", 2)
    collected = HostProbe(proc=proc, etc=tmp_path, measure=lambda: measured).collect()
    assert collected.data["bandwidth"] == {
        "bytes_per_s": 123e9,
        "source": "measured",
        "detail": "a probe's",
    }
    assert "bandwidth" not in collected.identity


def test_host_probe_falls_back_to_the_table_when_the_measurement_fails(tmp_path: Path) -> None:
    def broken() -> MemoryBandwidth | None:
        raise OSError("no memory to spare")

    proc = _host(tmp_path, "AMD EPYC 9654 96-Core Processor", 2)
    collected = HostProbe(proc=proc, etc=tmp_path, measure=broken).collect()
    assert collected.data["bandwidth"]["source"] == "table"
    assert collected.data["bandwidth"]["bytes_per_s"] == pytest.approx(921.6e9)  # 2 sockets
    unknown = _host(tmp_path, "AMD EPYC", 1)
    data = HostProbe(proc=unknown, etc=tmp_path, measure=lambda: None).collect().data
    assert "bandwidth" not in data and data["cpu_model"] == "AMD EPYC"


def test_buffer_plan_is_four_times_the_llc_at_least_a_gib_at_most_a_quarter_of_memory() -> None:
    this_vm = plan_buffer(480 * MIB, 22 * GIB)
    assert (this_vm.bytes, this_vm.capped) == (1920 * MIB, False)
    assert this_vm.describe() == "1920 MiB buffer (4.0x the 480 MiB last-level cache)"
    small_cache = plan_buffer(32 * MIB, 22 * GIB)
    assert (small_cache.bytes, small_cache.capped) == (GIB, False)
    tight = plan_buffer(480 * MIB, 4 * GIB)
    assert (tight.bytes, tight.capped) == (GIB, True)
    assert "capped at a quarter of available memory" in tight.describe()
    assert plan_buffer(None, 22 * GIB).describe() == "1024 MiB buffer (last-level cache unknown)"


def test_last_level_cache_is_the_largest_data_or_unified_cache(tmp_path: Path) -> None:
    for index, (level_type, size) in enumerate(
        [("Data", "48K"), ("Instruction", "4096M"), ("Unified", "2048K"), ("Unified", "491520K")]
    ):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "type").write_text(f"{level_type}\n")
        (tmp_path / f"index{index}" / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(tmp_path) == 480 * MIB
    assert last_level_cache_bytes(tmp_path / "absent") is None


def test_this_machine_s_measured_bandwidth_is_plausible_and_measured_once_a_boot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(memory_probe, "_measured", [])
    first = memory_probe.measured_bandwidth()
    assert first is not None
    assert 1e9 < first.bytes_per_s < 2e12
    assert first.source == "measured"
    assert first.detail is not None and re.search(r"by \d+ processes", first.detail)

    def measured_again() -> MemoryBandwidth | None:
        raise AssertionError("measured a second time")

    monkeypatch.setattr(memory_probe, "_measure", measured_again)
    assert memory_probe.measured_bandwidth() is first
    # another process of this boot reads the figure this one kept
    monkeypatch.setattr(memory_probe, "_measured", [])
    assert memory_probe.measured_bandwidth() == first
    kept = json.loads((tmp_path / "fleetbench" / "memory-bandwidth.json").read_text())
    assert kept["figure"]["bytes_per_s"] == first.bytes_per_s
    # a new boot measures again
    monkeypatch.setattr(memory_probe, "_measured", [])
    monkeypatch.setattr(memory_probe, "_cache_key", lambda: "another boot|2")
    monkeypatch.setattr(memory_probe, "_measure", lambda: None)
    assert memory_probe.measured_bandwidth() is None
