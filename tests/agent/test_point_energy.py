"""Each point's energy in a real sweep: the windows each runner records (llama-cpp-python's
around each measurement in the engine's process, the node's llama-batched-bench as each
point's line arrives) and a whole sweep counted by a powercap tree whose counter advances at
a known power while the engine runs. The counters themselves, and the rules that refuse a
figure, are tests/agent/test_energy.py's."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from fleetbench.agent.display import curve_table
from fleetbench.agent.energy import EnergyMeter
from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.batched_bench_binary import BatchedBenchBinaryRunner
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.agent.sweep import energy_line, measure_run
from fleetbench.contract.energy import tokens_per_joule

SPEC = SweepSpec(npp=(32,), ntg=(4,), npl=(1, 2, 4))


def test_the_in_process_runner_records_each_measurement_s_window(tiny_llama: Path) -> None:
    spec = SPEC.model_copy(update={"repeats": 2})
    before = time.monotonic()
    outcome = LlamaCppPythonRunner().run(tiny_llama, spec)
    after = time.monotonic()
    assert set(outcome.windows) == {(32, 4, 1), (32, 4, 2), (32, 4, 4)}
    for point in outcome.points:
        windows = outcome.windows[(point.pp, point.tg, point.b)]
        assert len(windows) == point.repeats == 2
        for start, end in windows:
            assert before < start < end < after  # the engine's process: the same clock
        # each window holds the measurement it times (the median of two: at most the longer)
        assert point.t is not None and point.t <= max(end - start for start, end in windows)
    spans = sorted(w for ws in outcome.windows.values() for w in ws)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # one at a time


def test_the_binary_s_points_arrive_as_each_ends(batched_bench: Path, gemma: Path) -> None:
    spec = SweepSpec(npp=(32,), ntg=(16,), npl=(1, 2, 4))
    outcome = BatchedBenchBinaryRunner(batched_bench).run(gemma, spec)
    ends = []
    for point in outcome.points:
        [(start, end)] = outcome.windows[(point.pp, point.tg, point.b)]
        assert point.t is not None and end - start == pytest.approx(point.t)
        ends.append(end)
    # each line came once its point was done, not all at the binary's exit: a point's end
    # is at least its own T after the one before's
    for (earlier, later), point in zip(itertools.pairwise(ends), outcome.points[1:], strict=True):
        assert point.t is not None and later - earlier >= 0.9 * point.t


@contextmanager
def _package_drawing(tmp_path: Path, watts: float) -> Iterator[Path]:
    """A powercap tree of one CPU package (the kernel's file names and units: microjoules)
    whose counter advances at `watts` every 5 ms while the block runs."""
    zone = tmp_path / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    counter = zone / "energy_uj"
    counter.write_text("1000000\n")
    stop = threading.Event()

    def draw() -> None:
        began, start = time.monotonic(), 1_000_000
        written = zone / "energy_uj.next"
        while not stop.wait(0.005):
            # whole, as sysfs answers a read: a reader never sees the file half written
            written.write_text(f"{start + int((time.monotonic() - began) * watts * 1e6)}\n")
            os.replace(written, counter)

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    try:
        yield tmp_path / "powercap"
    finally:
        stop.set()
        thread.join()


def test_a_sweep_on_the_cpu_is_counted_by_the_package_it_ran_on(
    gemma: Path, tmp_path: Path
) -> None:
    # on the CPU (a GPU node's too): the package's counter is the run's; a second or more a
    # point here
    spec = SweepSpec(npp=(32,), ntg=(48,), npl=(1, 2), n_gpu_layers=0)
    with _package_drawing(tmp_path, watts=50.0) as powercap:
        report = measure_run(
            gemma,
            spec,
            LlamaCppPythonRunner(),
            node="cpu-node",
            # read every 20 ms: a window of 0.2 s counts, so a faster CPU's points do too
            energy=EnergyMeter(powercap=powercap, interval=0.02),
        )
    assert report.energy is not None and report.energy.source == "rapl"
    assert report.energy.scope == "CPU package 0"
    for point in report.points:
        energy = point.energy
        assert energy is not None
        if energy.invalid is not None:  # a point under a second here: refused, never 0 J
            assert "too short" in energy.invalid and energy.joules is None
            continue
        assert energy.joules == pytest.approx(50.0 * energy.seconds, rel=0.15)
        assert point.t is not None and energy.seconds >= point.t
        per_joule = tokens_per_joule(point.b, point.tg, energy.joules)
        assert per_joule == pytest.approx(point.b * 48 / energy.joules)
    assert any(p.energy is not None and p.energy.joules for p in report.points)
    assert (energy_line(report) or "").startswith("energy counted by rapl (CPU package 0)")
    console = Console(width=200, record=True)
    console.print(curve_table(report.points, title="gemma"))
    [row] = [line for line in console.export_text().splitlines() if line.startswith("│ 32")][1:]
    b2 = report.points[1]
    assert b2.energy is not None and b2.energy.joules is not None
    assert row.rstrip(" │").endswith(f"{2 * 48 / b2.energy.joules:.2f}")  # its tokens/J


def test_a_report_without_energy_says_nothing_of_it(tiny_llama: Path, tmp_path: Path) -> None:
    report = measure_run(
        tiny_llama,
        SPEC,
        LlamaCppPythonRunner(),
        node="no-sensors",
        energy=EnergyMeter(powercap=tmp_path / "no-powercap"),
    )
    assert report.status == "ok" and report.energy is None and energy_line(report) is None
    assert all(p.energy is None for p in report.points)
    console = Console(width=200, record=True)
    console.print(curve_table(report.points, title="tiny"))
    assert "tokens/J" not in console.export_text()
