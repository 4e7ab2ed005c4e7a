"""A run's energy (agent/energy.py, agent/energy_sources.py): powercap trees built from
captured RAPL outputs and read from real files, NVML and amdsmi replayed with captured values,
and each rule that makes a window's joules invalid (tests/fixtures/energy/README.md says where
each capture comes from). The meter reads on a step clock: its k-th reading happens at
k x 0.1 s (the default interval), just after the replayed devices moved to what they hold
then, so every expected figure is exact whatever the machine's pace. Its thread asks every
0.025 s, for speed: readings 4 intervals apart still count as complete (up to 5)."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from fleetbench.agent import energy
from fleetbench.agent.energy import (
    EnergyMeter,
    Reading,
    WindowEnergy,
    point_energy_of,
    window_energy,
)
from fleetbench.agent.energy_sources import amdsmi_counter, visible_gpus
from fleetbench.agent.probes.nvidia import nvml_session
from fleetbench.contract.energy import PointEnergy, RunEnergy
from tests.agent.test_probes_captured import ReplayedNVML, captured_h100

CAPTURES = Path(__file__).parent.parent / "fixtures" / "energy"
STEP = 0.1  # the step clock's time between readings
INTERVAL = 0.025  # the meter's


class StepClock:
    """The meter's clock over replayed devices: reading k happens at k x STEP seconds, and
    `tick(k)` sets what the devices hold just before it is taken."""

    def __init__(self, tick: Callable[[int], None]) -> None:
        self._tick = tick
        self.reads = 0
        self._wanted = math.inf
        self._enough = threading.Event()

    def __call__(self) -> float:
        k = self.reads
        self._tick(k)
        self.reads += 1
        if self.reads >= self._wanted:
            self._enough.set()
        return k * STEP

    def wait_for(self, reads: int) -> None:
        self._wanted = reads
        if self.reads < reads:
            assert self._enough.wait(10), "the meter stopped reading"


def at(k: float) -> float:
    """The moment of reading k (fractions: between two readings)."""
    return k * STEP


class NoNvidia:
    """A pynvml that finds no driver: the node's own GPUs stay out of these tests."""

    NVMLError = pynvml.NVMLError

    def nvmlInit(self) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


class NoAmd:
    """An amdsmi that finds no GPU."""

    def amdsmi_init(self) -> None:
        raise RuntimeError("AMDSMI_STATUS_INIT_ERROR")


def meter(tmp_path: Path, clock: Callable[[], float], **sources: Any) -> EnergyMeter:
    found: dict[str, Any] = {"nvml": NoNvidia(), "amdsmi": NoAmd(), "powercap": tmp_path}
    return EnergyMeter(**(found | sources), interval=INTERVAL, clock=clock)


def figures(point: PointEnergy | None) -> tuple[Any, ...]:
    """A point's joules, seconds, sampled watts and reason, to compare with pytest.approx."""
    assert point is not None
    return point.joules, point.seconds, point.watts_sampled, point.invalid


def meter_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "energy-meter"]


# --- RAPL: powercap trees of captured zones, read from real files -------------------------


def xeon_zones(machine: str) -> dict[str, tuple[str, int, int]]:
    """One machine's table of rapl-xeon-servers.txt: zone: (name, energy_uj, range_uj)."""
    text = (CAPTURES / "rapl-xeon-servers.txt").read_text()
    section = text.split(f"# {machine}")[1].split("\n\n")[0]
    rows = re.findall(
        r"^# (intel-rapl:[\d:]+)\s*;\s*\S+\s*;\s*(\S+)\s*;\s*(\d+);\s*(\d+)", section, re.M
    )
    return {zone: (name, int(uj), int(range_uj)) for zone, name, uj, range_uj in rows}


def laptop_zones() -> dict[str, tuple[str, int, int]]:
    """rapl-laptop-powercap-info.txt's package and its core and uncore subzones."""
    text = (CAPTURES / "rapl-laptop-powercap-info.txt").read_text()
    zones = re.findall(
        r"Zone (\d+(?::\d+)?)\n\s+name: (\S+)\n\s+enabled: \d\n\s+max_energy_range_uj: (\d+)\n"
        r"\s+energy_uj: (\d+)",
        text,
    )
    return {f"intel-rapl:{zone}": (name, int(uj), int(r)) for zone, name, r, uj in zones}


class Powercap:
    """A /sys/class/powercap-like tree (the flat view: every zone a directory of its own,
    beside the `intel-rapl` control type) whose zones' counters advance at given watts,
    wrapping at their range as the hardware's do."""

    def __init__(
        self, root: Path, zones: dict[str, tuple[str, int, int]], watts: dict[str, float]
    ) -> None:
        self.root, self.zones, self.watts = root, zones, watts
        (root / "intel-rapl").mkdir()
        (root / "intel-rapl" / "enabled").write_text("1\n")
        for zone, (name, energy_uj, range_uj) in zones.items():
            (root / zone).mkdir()
            (root / zone / "name").write_text(f"{name}\n")
            (root / zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
            (root / zone / "energy_uj").write_text(f"{energy_uj}\n")

    def tick(self, k: int) -> None:
        for zone, (_name, start_uj, range_uj) in self.zones.items():
            now_uj = start_uj + round(self.watts.get(zone, 0.0) * at(k) * 1e6)
            (self.root / zone / "energy_uj").write_text(f"{now_uj % range_uj}\n")


def test_four_xeon_packages_and_their_dram_are_counted_and_their_cores_are_not(
    tmp_path: Path,
) -> None:
    zones = xeon_zones("Jacob Output")
    # each zone at a rate of its own, the cores fastest: counting them would show
    watts = {zone: 40.0 + 7 * i for i, zone in enumerate(zones)}
    watts |= {zone: 500.0 for zone, (name, _, _) in zones.items() if name == "core"}
    powercap = Powercap(tmp_path, zones, watts)
    clock = StepClock(powercap.tick)
    with meter(tmp_path, clock) as cpu:
        clock.wait_for(20)
        assert meter_threads() != []
    assert meter_threads() == []
    counted = sum(w for zone, w in watts.items() if zones[zone][0] != "core")
    window = (at(2.5), at(17.25))  # edges between readings: the counters interpolated
    point = cpu.point_energy([window], on_accelerator=False)
    assert figures(point) == (pytest.approx(counted * at(14.75)), pytest.approx(1.475), None, None)
    assert cpu.run_energy(on_accelerator=False) == RunEnergy(
        source="rapl", scope="CPU packages 0, 1, 2, 3 and their DRAM"
    )
    assert cpu.run_energy(on_accelerator=True) is None
    assert cpu.point_energy([window], on_accelerator=True) is None


def test_a_counter_that_wraps_at_its_range_is_counted_on(tmp_path: Path) -> None:
    """smp01: zone intel-rapl:0 is package-3, and the DRAM counters' range is a quarter of
    the packages'. Package 3's DRAM, 5.4 kJ short of its range at the start, draws 10 kW
    here so that it wraps inside the window (between readings 5 and 6)."""
    zones = xeon_zones("smp01")
    name, start_uj, range_uj = zones["intel-rapl:0:0"]
    assert (name, range_uj - start_uj) == ("dram", 5_433_883_832)
    watts = dict.fromkeys(zones, 150.0) | {"intel-rapl:0:0": 10_000.0}
    powercap = Powercap(tmp_path, zones, watts)
    clock = StepClock(powercap.tick)
    with meter(tmp_path, clock) as cpu:
        clock.wait_for(16)
    assert int((tmp_path / "intel-rapl:0:0" / "energy_uj").read_text()) < start_uj  # wrapped
    point = cpu.point_energy([(at(1), at(13))], on_accelerator=False)
    assert point is not None and point.joules == pytest.approx(sum(watts.values()) * at(12))
    run = cpu.run_energy(on_accelerator=False)
    assert run is not None and run.scope == "CPU packages 0, 1, 2, 3 and their DRAM"


def test_a_laptop_s_package_is_counted_without_its_core_and_uncore(tmp_path: Path) -> None:
    """The package's rate is the one the two codecarbon readings give: 1414.039227 J over
    their 10 minutes."""
    first, second = map(
        int,
        re.findall(r": (\d+)$", (CAPTURES / "rapl-codecarbon-two-readings.txt").read_text(), re.M),
    )
    package_watts = (second - first) / 1e6 / 600
    assert package_watts == pytest.approx(2.3567, abs=1e-4)
    zones = laptop_zones()
    assert [name for name, _, _ in zones.values()] == ["package-0", "core", "uncore"]
    watts = {"intel-rapl:0": package_watts, "intel-rapl:0:0": 1.5, "intel-rapl:0:1": 0.6}
    clock = StepClock(Powercap(tmp_path, zones, watts).tick)
    with meter(tmp_path, clock) as cpu:
        clock.wait_for(14)
    point = cpu.point_energy([(at(1), at(12))], on_accelerator=False)
    assert point is not None and point.joules == pytest.approx(package_watts * at(11), rel=1e-6)
    assert cpu.run_energy(on_accelerator=False) == RunEnergy(source="rapl", scope="CPU package 0")


def test_psys_and_the_mmio_copy_of_the_package_are_not_counted(tmp_path: Path) -> None:
    """The zones of an XPS 13 7390 (rapl-xps-7390-names.txt: names only, so the counters
    start at 0): psys holds the package, and intel-rapl-mmio:0 is the package again."""
    names = re.findall(
        r"/sys/class/powercap/([\w:-]+)/name:(\S+)",
        (CAPTURES / "rapl-xps-7390-names.txt").read_text(),
    )
    zones = {zone: (name, 0, 262_143_328_850) for zone, name in names}
    assert zones["intel-rapl:1"][0] == "psys" and zones["intel-rapl-mmio:0"][0] == "package-0"
    watts = dict.fromkeys(zones, 9.0) | {"intel-rapl:0": 4.0}
    clock = StepClock(Powercap(tmp_path, zones, watts).tick)
    with meter(tmp_path, clock) as cpu:
        clock.wait_for(14)
    point = cpu.point_energy([(at(0), at(12))], on_accelerator=False)
    assert point is not None and point.joules == pytest.approx(4.0 * at(12))


def test_each_die_of_a_package_is_counted(tmp_path: Path) -> None:
    """A package of two dies has a zone for each, named as the kernel names them
    (intel_rapl_common: "package-%d-die-%d"; no capture of one was found): smp04's two
    package counters, renamed so."""
    zones = {
        zone: (f"package-0-die-{die}", uj, range_uj)
        for die, (zone, (_name, uj, range_uj)) in enumerate(xeon_zones("smp04").items())
    }
    clock = StepClock(Powercap(tmp_path, zones, {"intel-rapl:0": 90.0, "intel-rapl:1": 70.0}).tick)
    with meter(tmp_path, clock) as cpu:
        clock.wait_for(14)
    point = cpu.point_energy([(at(0), at(12))], on_accelerator=False)
    assert point is not None and point.joules == pytest.approx(160.0 * at(12))
    assert cpu.run_energy(on_accelerator=False) == RunEnergy(source="rapl", scope="CPU package 0")


def test_a_window_that_just_ended_waits_for_the_reading_after_it(tmp_path: Path) -> None:
    """Asked while the meter runs, for a window that ends after its latest reading."""
    clock = StepClock(Powercap(tmp_path, laptop_zones(), {"intel-rapl:0": 2.0}).tick)
    with meter(tmp_path, clock) as cpu:
        clock.wait_for(14)
        end = at(clock.reads + 0.5)  # after every reading taken yet
        point = cpu.point_energy([(at(1), end)], on_accelerator=False)
    assert point is not None and point.joules == pytest.approx(2.0 * (end - at(1)), rel=1e-6)


def test_the_meter_reads_once_on_enter_and_once_more_on_exit(tmp_path: Path) -> None:
    """Whatever its interval: the last point's window ends after the thread's last round,
    and the reading on exit covers it."""
    clock = StepClock(Powercap(tmp_path, laptop_zones(), {"intel-rapl:0": 2.0}).tick)
    with EnergyMeter(
        nvml=NoNvidia(), amdsmi=NoAmd(), powercap=tmp_path, interval=3600, clock=clock
    ):
        assert clock.reads == 1
    assert clock.reads == 2


def test_an_unreadable_package_counter_leaves_no_cpu_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Since Linux 5.10 energy_uj is root's only (CVE-2020-8694). Root reads any file here,
    so the file answers as it does to anyone else: Permission denied."""
    Powercap(tmp_path, laptop_zones(), {})
    denied = tmp_path / "intel-rapl:0" / "energy_uj"
    read_text = Path.read_text

    def as_a_user(path: Path, *args: Any, **kwargs: Any) -> str:
        if path == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", as_a_user)
    with meter(tmp_path, StepClock(lambda k: None)) as cpu:
        assert meter_threads() == []
    assert cpu.run_energy(on_accelerator=False) is None
    assert cpu.point_energy([(0.0, 1.0)], on_accelerator=False) is None


def test_a_missing_counter_file_or_dram_leaves_out_only_what_it_counts(tmp_path: Path) -> None:
    zones = xeon_zones("Jacob Output")
    Powercap(tmp_path, zones, {})
    (tmp_path / "intel-rapl:2:1" / "energy_uj").unlink()  # package 2's DRAM
    with meter(tmp_path, StepClock(lambda k: None)) as without_one_dram:
        pass
    (tmp_path / "intel-rapl:3" / "energy_uj").unlink()  # package 3 itself
    with meter(tmp_path, StepClock(lambda k: None)) as without_a_package:
        pass
    assert without_one_dram.run_energy(on_accelerator=False) == RunEnergy(
        source="rapl", scope="CPU packages 0, 1, 2, 3 and the DRAM of packages 0, 1, 3"
    )
    assert without_a_package.run_energy(on_accelerator=False) is None


def test_a_node_without_a_readable_counter_has_no_figures_and_no_thread() -> None:
    """This machine as it is: the real pynvml, amdsmi and /sys/class/powercap."""
    with nvml_session() as (nvml, _absent):
        if nvml is not None:
            pytest.skip("this machine has an NVIDIA driver")
    if any(Path("/sys/class/powercap").glob("intel-rapl:*/energy_uj")):
        pytest.skip("this machine has RAPL counters")
    with EnergyMeter() as here:
        assert meter_threads() == []
    for on_accelerator in (True, False):
        assert here.run_energy(on_accelerator=on_accelerator) is None
        assert here.point_energy([(0.0, 5.0)], on_accelerator=on_accelerator) is None


# --- NVML: replayed with the captured H100's power -----------------------------------------


def dmon_watts(state: str) -> list[int]:
    """The pwr column of the captured H100's `nvidia-smi dmon` in that state."""
    lines = (CAPTURES / f"nvidia-smi-dmon-h100-{state}.txt").read_text().splitlines()
    return [int(line.split()[1]) for line in lines if not line.startswith("#")]


class EnergyNVML(ReplayedNVML):
    """ReplayedNVML with each GPU's energy counter (mJ) and power (mW): `tick(k)` moves
    each GPU's counter on by its k-th `watts` (the list repeated) over one step. A GPU's
    `fail_at` reading raises its NVML error; its `hang_at` reading waits for `released`."""

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        h100 = captured_h100()
        super().__init__(gpus, h100.driver, h100.cuda)
        self.released = threading.Event()
        for gpu in gpus:
            gpu.setdefault("energy_mj", 0)
            gpu["power_mw"] = gpu["watts"][0] * 1000

    def tick(self, k: int) -> None:
        for gpu in self.gpus:
            watts = gpu["watts"][k % len(gpu["watts"])]
            gpu["energy_mj"] += watts * 1000 * STEP if k else 0
            gpu["power_mw"] = watts * 1000
            gpu["now"] = k

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: dict[str, Any]) -> int:
        if "hang_at" in gpu and gpu.get("now") == gpu["hang_at"]:
            self.released.wait()
        if ("fail_at" in gpu and gpu.get("now") == gpu["fail_at"]) or "unsupported" in gpu:
            raise gpu.get("error", pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
        return round(float(gpu["energy_mj"]))

    def nvmlDeviceGetPowerUsage(self, gpu: dict[str, Any]) -> int:
        return int(gpu["power_mw"])


def h100s(*watts: list[int], **extra: Any) -> EnergyNVML:
    h100 = captured_h100().gpus[0]
    return EnergyNVML(
        [h100 | {"uuid": f"GPU-{i}{i}{i}{i}", "watts": w} | extra for i, w in enumerate(watts)]
    )


def joules_between(nvml: EnergyNVML, first: int, last: int, gpus: list[int]) -> float:
    """What the replayed GPUs' counters advance from reading `first` to reading `last`."""
    return sum(
        float(nvml.gpus[g]["watts"][k % len(nvml.gpus[g]["watts"])]) * STEP
        for g in gpus
        for k in range(first + 1, last + 1)
    )


def test_the_gpus_counters_are_summed_and_cross_checked_with_their_power(tmp_path: Path) -> None:
    nvml = h100s(dmon_watts("load"), dmon_watts("idle"))
    clock = StepClock(nvml.tick)
    with meter(tmp_path, clock, nvml=nvml) as gpus:
        clock.wait_for(20)
        assert not nvml.shut_down
    assert nvml.shut_down
    point = gpus.point_energy([(at(3), at(15))], on_accelerator=True)
    sampled = [dmon_watts("load")[k % 5] + 69 for k in range(3, 16)]
    assert figures(point) == (
        pytest.approx(joules_between(nvml, 3, 15, [0, 1])),
        pytest.approx(1.2),
        pytest.approx(sum(sampled) / len(sampled)),
        None,
    )
    assert point is not None and point.joules == pytest.approx(
        (633 + 69) * at(12), rel=0.01
    )  # ~633 W under load
    assert gpus.run_energy(on_accelerator=True) == RunEnergy(
        source="nvml", scope="GPU boards: 0, 1 (NVIDIA H100 80GB HBM3)"
    )
    assert gpus.run_energy(on_accelerator=False) is None


def test_only_the_gpus_cuda_visible_devices_names_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = h100s(dmon_watts("idle"), dmon_watts("load"), dmon_watts("idle"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-22,0")  # a UUID's prefix, an index
    clock = StepClock(nvml.tick)
    with meter(tmp_path, clock, nvml=nvml) as gpus:
        clock.wait_for(14)
    point = gpus.point_energy([(at(0), at(12))], on_accelerator=True)
    assert point is not None and point.joules == pytest.approx(joules_between(nvml, 0, 12, [0, 2]))
    run = gpus.run_energy(on_accelerator=True)
    assert run is not None and run.scope == "GPU boards: 0, 2 (NVIDIA H100 80GB HBM3)"


def test_cuda_visible_devices_as_cuda_reads_it() -> None:
    uuids = ["GPU-aaaa-1", "GPU-bbbb-2", "GPU-aaab-3"]
    assert visible_gpus(uuids, None) == [0, 1, 2]
    assert visible_gpus(uuids, "2,0") == [2, 0]
    assert visible_gpus(uuids, "GPU-bbbb") == [1]
    assert visible_gpus(uuids, "GPU-aaa,1") == []  # a prefix of two: nothing from there on
    assert visible_gpus(uuids, "1,7,0") == [1]  # no GPU 7: the rest is not read
    assert visible_gpus(uuids, "") == []
    assert visible_gpus(uuids, "-1") == []


def test_a_gpu_without_an_energy_counter_leaves_no_gpu_source(tmp_path: Path) -> None:
    """NVML answers NotSupported for a GPU older than Volta: a sum without that board would
    understate the run, so there is none."""
    nvml = h100s(dmon_watts("load"), dmon_watts("idle"))
    nvml.gpus[1]["unsupported"] = True
    with meter(tmp_path, StepClock(nvml.tick), nvml=nvml) as gpus:
        assert meter_threads() == []
    assert nvml.shut_down
    assert gpus.run_energy(on_accelerator=True) is None
    assert gpus.point_energy([(0.0, 1.0)], on_accelerator=True) is None


def test_an_nvml_error_ends_the_series_with_what_it_had(tmp_path: Path) -> None:
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml = h100s(dmon_watts("load"), fail_at=15, error=lost)
    clock = StepClock(nvml.tick)
    with meter(tmp_path, clock, nvml=nvml) as gpus:
        clock.wait_for(16)
        for _ in range(1000):  # the thread ends itself, and NVML's session, on the error
            if not meter_threads():
                break
            threading.Event().wait(0.01)
    assert nvml.shut_down and clock.reads == 16
    before, after = (at(1), at(13)), (at(8), at(22))
    assert figures(gpus.point_energy([after], on_accelerator=True)) == (
        None,
        pytest.approx(1.4),
        None,
        "the counter's readings end 0.80 s before the window",
    )
    point = gpus.point_energy([before, after], on_accelerator=True)
    assert point is not None and point.joules == pytest.approx(joules_between(nvml, 1, 13, [0]))


def test_a_read_that_hangs_does_not_hold_up_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(energy, "_HUNG_AFTER_S", 0.2)
    nvml = h100s(dmon_watts("load"), hang_at=15)
    clock = StepClock(nvml.tick)
    try:
        with meter(tmp_path, clock, nvml=nvml) as gpus:
            clock.wait_for(16)
        assert meter_threads() != [] and not nvml.shut_down  # left behind, still in NVML
        point = gpus.point_energy([(at(1), at(13))], on_accelerator=True)
        assert point is not None and point.joules == pytest.approx(joules_between(nvml, 1, 13, [0]))
        assert gpus.run_energy(on_accelerator=True) is not None
    finally:
        nvml.released.set()
        for thread in meter_threads():
            thread.join(10)
    assert nvml.shut_down  # the thread ends NVML's session once its read returns


# --- amdsmi: replayed with captured accumulators ---------------------------------------------


def rust_log() -> list[tuple[str, int, float]]:
    """(handle, accumulator, resolution) of each amdsmi_get_energy_count in the captured log."""
    text = (CAPTURES / "amdsmi-energy-count-goes-back.txt").read_text()
    found = re.findall(r"\((0x[0-9a-f]+)\) returned \(energy=(\d+), res=([\d.]+)", text)
    return [(handle, int(count), float(res)) for handle, count, res in found]


class ReplayedAmdsmi:
    """amdsmi's Python API answered with captured accumulators: each GPU's `counts` (one a
    reading, the last kept, or moved on by `per_read` counts a reading) under `key`."""

    def __init__(self, gpus: list[dict[str, Any]], key: str = "energy_accumulator") -> None:
        self.gpus, self.key = gpus, key
        self.shut_down = False
        self.now = 0

    def tick(self, k: int) -> None:
        self.now = k

    def amdsmi_init(self) -> None:
        self.shut_down = False

    def amdsmi_shut_down(self) -> None:
        self.shut_down = True

    def amdsmi_get_processor_handles(self) -> list[dict[str, Any]]:
        return self.gpus

    def amdsmi_get_gpu_asic_info(self, gpu: dict[str, Any]) -> dict[str, Any]:
        return {"market_name": gpu["name"]}

    def amdsmi_get_energy_count(self, gpu: dict[str, Any]) -> dict[str, Any]:
        counts = gpu["counts"]
        count = counts[min(self.now, len(counts) - 1)] + gpu.get("per_read", 0) * self.now
        return {self.key: count, "counter_resolution": gpu["resolution"], "timestamp": self.now}

    def amdsmi_get_power_info(self, gpu: dict[str, Any]) -> dict[str, Any]:
        return {"current_socket_power": "N/A", "average_socket_power": gpu.get("watts", "N/A")}


def test_the_amd_gpus_accumulators_are_summed_at_their_resolution(tmp_path: Path) -> None:
    """The four GPUs of the captured log, from their first accumulators; each then draws
    153 W (1 000 000 counts of 15.3 uJ in the 0.1 s between two readings) and says so."""
    first: dict[str, tuple[int, float]] = {}
    for handle, count, res in rust_log():
        first.setdefault(handle, (count, res))
    gpus = [
        {
            "name": "AMD Instinct MI300A",
            "counts": [count],
            "resolution": res,
            "per_read": 1_000_000,
            "watts": 153,
        }
        for count, res in first.values()
    ]
    amd = ReplayedAmdsmi(gpus)
    clock = StepClock(amd.tick)
    with meter(tmp_path, clock, amdsmi=amd) as gpus_meter:
        clock.wait_for(14)
    assert amd.shut_down
    point = gpus_meter.point_energy([(at(0.5), at(12.5))], on_accelerator=True)
    assert figures(point) == (pytest.approx(4 * 153 * 1.2), pytest.approx(1.2), 4 * 153, None)
    assert gpus_meter.run_energy(on_accelerator=True) == RunEnergy(
        source="amdsmi", scope="GPU boards: 0, 1, 2, 3 (AMD Instinct MI300A)"
    )


def test_an_amd_counter_that_went_back_gives_no_joules(tmp_path: Path) -> None:
    """The captured log's GPU 0x56254b5cf110 reads 4750896266, then 4736943791 a second
    later."""
    went_back = [count for handle, count, _ in rust_log() if handle == "0x56254b5cf110"]
    assert went_back == [4_750_896_266, 4_736_943_791]
    counts = [went_back[0] + 20_000 * k for k in range(8)] + [
        went_back[1] + 20_000 * k for k in range(8)
    ]
    amd = ReplayedAmdsmi([{"name": "AMD GPU", "counts": counts, "resolution": 15.3}])
    clock = StepClock(amd.tick)
    with meter(tmp_path, clock, amdsmi=amd) as gpus:
        clock.wait_for(16)
    assert (went_back[0] - went_back[1]) * 15.3e-6 == pytest.approx(213.47, abs=0.01)
    drop = (counts[7] - counts[8]) * 15.3e-6
    assert figures(gpus.point_energy([(at(1), at(14))], on_accelerator=True)) == (
        None,
        pytest.approx(1.3),
        None,
        f"the counter went back by {drop:.1f} J",
    )


def test_an_older_rocm_s_accumulator_that_does_not_move_gives_no_joules(tmp_path: Path) -> None:
    """The MI100 of the capture: ROCm 6.0's `power` key, the same count at every read."""
    reply = (CAPTURES / "amdsmi-mi100-energy-count.txt").read_text()
    count, resolution = re.findall(r"\{'power': (\d+), 'counter_resolution': ([\d.]+)", reply)[0]
    amd = ReplayedAmdsmi(
        [{"name": "AMD Instinct MI100", "counts": [int(count)], "resolution": float(resolution)}],
        key="power",
    )
    clock = StepClock(amd.tick)
    with meter(tmp_path, clock, amdsmi=amd) as gpus:
        clock.wait_for(14)
    assert figures(gpus.point_energy([(at(0), at(12))], on_accelerator=True)) == (
        None,
        pytest.approx(1.2),
        None,
        "the counter did not advance over 1.20 s",
    )
    assert gpus.run_energy(on_accelerator=True) == RunEnergy(
        source="amdsmi", scope="GPU board: 0 (AMD Instinct MI100)"
    )


def test_amd_joules_are_the_accumulator_times_its_resolution() -> None:
    """rocm-smi's own conversion of the same counters: 65628 counts are 1004108.41 uJ."""
    text = (CAPTURES / "amdsmi-rocm-smi-energy.txt").read_text()
    counts = [int(c) for c in re.findall(r"Energy counter: (\d+)", text)]
    microjoules = [float(uj) for uj in re.findall(r"Accumulated Energy \(uJ\): ([\d.]+)", text)]
    amd = ReplayedAmdsmi(
        [{"name": "AMD GPU", "counts": [c], "resolution": 15.3, "watts": 30} for c in counts]
    )
    counter = amdsmi_counter(amd)
    assert counter is not None
    joules, watts = counter.read()
    assert joules == pytest.approx([uj / 1e6 for uj in microjoules], rel=1e-7)
    assert watts == 60


# --- the rules, one by one ---------------------------------------------------------------------


def steady(watts: float, until: float, every: float = 0.1, devices: int = 1) -> list[Reading]:
    """Readings of `devices` counters each drawing `watts`, every `every` s from 0."""
    steps = round(until / every)
    return [
        Reading(
            k * every, tuple(1000.0 + watts * k * every for _ in range(devices)), watts * devices
        )
        for k in range(steps + 1)
    ]


def window_figures(window: WindowEnergy) -> tuple[Any, ...]:
    return window.joules, window.seconds, window.watts_sampled, window.invalid


def rule(readings: list[Reading], start: float, end: float) -> WindowEnergy:
    return window_energy(readings, (start, end), interval=0.1, update_period_s=0.1)


def test_the_counters_are_interpolated_at_the_window_s_edges() -> None:
    readings = steady(300.0, 10.0, devices=2)
    measured = rule(readings, 1.23, 4.56)
    assert window_figures(measured) == (
        pytest.approx(2 * 300 * 3.33),
        pytest.approx(3.33),
        600.0,
        None,
    )
    exact = rule(readings, 1.0, 2.0)
    assert exact.joules == pytest.approx(600.0)


@pytest.mark.parametrize(
    ("start", "end", "why"),
    [
        (1.0, 1.42, "0.42 s is too short for a counter read every 0.1 s"),
        (-0.5, 2.0, "the counter's readings begin 0.50 s after the window"),
        (8.0, 10.3, "the counter's readings end 0.30 s before the window"),
    ],
)
def test_a_window_too_short_or_not_covered_is_invalid(start: float, end: float, why: str) -> None:
    assert window_figures(rule(steady(50.0, 10.0), start, end)) == (
        None,
        pytest.approx(end - start),
        None,
        why,
    )


def test_a_window_with_readings_missing_is_invalid() -> None:
    readings = [r for r in steady(50.0, 10.0) if not 2.0 < r.at < 2.7]
    assert rule(readings, 1.0, 4.0).invalid == (
        "readings missing: 0.70 s between two readings, more than 5 x the 0.1 s interval"
    )
    assert rule(readings, 3.0, 6.0).joules == pytest.approx(150.0)  # the gap is outside
    assert rule(readings, 2.65, 6.0).invalid is not None  # the gap is around its start


def test_two_readings_ten_minutes_apart_are_no_measurement() -> None:
    """The codecarbon capture's two reads of a package's counter."""
    uj = re.findall(r": (\d+)$", (CAPTURES / "rapl-codecarbon-two-readings.txt").read_text(), re.M)
    readings = [Reading(0.0, (int(uj[0]) / 1e6,)), Reading(600.0, (int(uj[1]) / 1e6,))]
    assert window_energy(readings, (0.0, 600.0), interval=0.1, update_period_s=0.001) == (
        WindowEnergy(
            seconds=600.0,
            invalid="readings missing: 600.00 s between two readings, more than 5 x the 0.1 s "
            "interval",
        )
    )


def test_a_counter_that_went_back_or_stood_still_gives_no_joules() -> None:
    readings = steady(100.0, 5.0, devices=2)
    reloaded = [
        Reading(r.at, (r.joules[0], r.joules[1] - 800.0 if r.at >= 2.0 else r.joules[1]), r.watts)
        for r in readings
    ]
    assert rule(reloaded, 1.0, 3.0).invalid == "the counter went back by 790.0 J"
    assert rule(reloaded, 2.0, 4.0).joules == pytest.approx(400.0)  # after the reload: fine
    still = [Reading(r.at, (5000.0,), 0.0) for r in readings]
    assert rule(still, 1.0, 3.0) == WindowEnergy(
        seconds=2.0, invalid="the counter did not advance over 2.00 s"
    )


def test_a_counter_and_sampled_power_that_disagree_over_5_s_give_no_joules() -> None:
    readings = [Reading(r.at, r.joules, 95.0) for r in steady(312.0, 20.0)]
    assert rule(readings, 1.0, 7.0).invalid == (
        "the counter's mean 312.0 W and the 95.0 W sampled disagree by more than a factor 2"
    )
    assert rule(readings, 1.0, 5.5).joules == pytest.approx(312 * 4.5)  # too short to check
    agreeing = [Reading(r.at, r.joules, 200.0) for r in steady(312.0, 20.0)]
    assert window_figures(rule(agreeing, 1.0, 7.0)) == (pytest.approx(312 * 6), 6.0, 200.0, None)
    unsampled = [Reading(r.at, r.joules, None) for r in readings]
    assert rule(unsampled, 1.0, 7.0).joules == pytest.approx(312 * 6)


def test_a_point_is_the_median_of_its_valid_windows() -> None:
    def measured(joules: float, seconds: float, watts: float | None = None) -> WindowEnergy:
        return WindowEnergy(seconds=seconds, joules=joules, watts_sampled=watts)

    short = WindowEnergy(seconds=0.3, invalid="0.30 s is too short for a counter read every 0.1 s")
    odd = [measured(90.0, 3.0, 30.0), short, measured(300.0, 9.0, 33.0), measured(120.0, 4.0, 31.0)]
    assert point_energy_of(odd) == PointEnergy(joules=120.0, seconds=4.0, watts_sampled=31.0)
    even = [measured(90.0, 3.0), measured(300.0, 9.0), measured(120.0, 4.0), measured(100.0, 3.5)]
    assert point_energy_of(even) == PointEnergy(joules=110.0, seconds=3.75)
    assert point_energy_of([short, WindowEnergy(seconds=2.0, invalid="later")]) == PointEnergy(
        seconds=0.3, invalid="0.30 s is too short for a counter read every 0.1 s"
    )
    assert point_energy_of([]) is None


@pytest.fixture(autouse=True)
def _no_meter_left_running() -> Iterator[None]:
    yield
    assert meter_threads() == []
