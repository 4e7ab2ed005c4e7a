"""What a run's points cost in energy: the node's energy counters (agent/energy_sources.py)
read by a thread of its own while the run goes on, and each point's joules worked out from
those readings over its repeats' measurement windows (contract/energy.py says what the
figures mean). A window the readings cannot vouch for gets no joules and the reason why."""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetbench.agent.energy_sources import Counter, amdsmi_counter, nvml_counter, rapl_counter
from fleetbench.contract.energy import EnergySource, PointEnergy, RunEnergy

__all__ = [
    "EnergyMeter",
    "Reading",
    "Window",
    "WindowEnergy",
    "point_energy_of",
    "window_energy",
]

Window = tuple[float, float]
"""time.monotonic() at the start and at the end of one measurement of a point."""

SHORTEST_IN_READS = 10  # a window spans at least 10 reads (or counter refreshes)
LONGEST_GAP_IN_INTERVALS = 5  # a longer gap between readings: readings are missing
CROSS_CHECK_FROM_S = 5.0  # the sampled watts are noisy over shorter windows
CROSS_CHECK_FACTOR = 2.0
_HUNG_AFTER_S = 10.0  # a read that long is stuck (a GPU off the bus): exit does not wait
_ACCELERATORS: tuple[EnergySource, ...] = ("nvml", "amdsmi")


@dataclass(frozen=True)
class Reading:
    """One read of a source: when (monotonic seconds), each device's cumulative joules, and
    the devices' summed instantaneous watts (None: the source has no such reading)."""

    at: float
    joules: tuple[float, ...]
    watts: float | None = None


@dataclass(frozen=True)
class WindowEnergy:
    """One window's figures: joules, or the reason there are none."""

    seconds: float
    joules: float | None = None
    watts_sampled: float | None = None
    invalid: str | None = None


def window_energy(
    readings: Sequence[Reading], window: Window, *, interval: float, update_period_s: float
) -> WindowEnergy:
    """The joules `readings` (in time order) count over `window`: each device's counter
    interpolated linearly at the window's edges, summed over the devices. Invalid where the
    window is too short for the counter, not covered by the readings, has readings missing,
    or where the counter went back, did not advance, or disagrees with the sampled watts."""
    start, end = window
    seconds = end - start if math.isfinite(end - start) else 0.0
    period = max(interval, update_period_s)
    if not seconds >= SHORTEST_IN_READS * period:
        return _invalid(
            seconds, f"{seconds:.2f} s is too short for a counter read every {period:g} s"
        )
    if not readings or readings[0].at > start:
        late = readings[0].at - start if readings else math.inf
        return _invalid(seconds, f"the counter's readings begin {late:.2f} s after the window")
    if readings[-1].at < end:
        early = end - readings[-1].at
        return _invalid(seconds, f"the counter's readings end {early:.2f} s before the window")
    # by bisection: an hours-long sweep holds 10 readings a second, read for every point
    first = bisect.bisect_right(readings, start, key=_time) - 1  # the last at or before start
    last = bisect.bisect_left(readings, end, key=_time)  # the first at or after the end
    span = readings[first : last + 1]
    gap = max(later.at - earlier.at for earlier, later in itertools.pairwise(span))
    if gap > LONGEST_GAP_IN_INTERVALS * interval:
        return _invalid(
            seconds,
            f"readings missing: {gap:.2f} s between two readings, more than "
            f"{LONGEST_GAP_IN_INTERVALS} x the {interval:g} s interval",
        )
    drop = sum(
        max(0.0, before - after)
        for earlier, later in itertools.pairwise(span)
        for before, after in zip(earlier.joules, later.joules, strict=True)
    )
    if drop > 0:
        return _invalid(seconds, f"the counter went back by {drop:.1f} J")
    joules = _at(span, end) - _at(span, start)
    if not joules > 0:
        return _invalid(seconds, f"the counter did not advance over {seconds:.2f} s")
    inside = [reading.watts for reading in span if start <= reading.at <= end]
    watts = None if not inside or None in inside else statistics.fmean(w or 0.0 for w in inside)
    if watts is not None and seconds >= CROSS_CHECK_FROM_S:
        counted = joules / seconds
        if not min(counted, watts) * CROSS_CHECK_FACTOR >= max(counted, watts):
            return _invalid(
                seconds,
                f"the counter's mean {counted:.1f} W and the {watts:.1f} W sampled disagree "
                f"by more than a factor {CROSS_CHECK_FACTOR:g}",
            )
    return WindowEnergy(seconds=seconds, joules=joules, watts_sampled=watts)


def _time(reading: Reading) -> float:
    return reading.at


def _at(span: Sequence[Reading], moment: float) -> float:
    """The devices' summed counter at `moment`, linear between the readings around it."""
    after = next(i for i, reading in enumerate(span) if reading.at >= moment)
    later = span[after]
    if after == 0 or later.at == moment:
        return sum(later.joules)
    earlier = span[after - 1]
    share = (moment - earlier.at) / (later.at - earlier.at)
    return sum(a + (b - a) * share for a, b in zip(earlier.joules, later.joules, strict=True))


def _invalid(seconds: float, why: str) -> WindowEnergy:
    return WindowEnergy(seconds=max(0.0, seconds), invalid=why)


def point_energy_of(windows: Sequence[WindowEnergy]) -> PointEnergy | None:
    """A point's energy from its repeats' windows: the median window of the valid ones by
    joules (the two middle ones averaged where their number is even), else the first
    window's reason; None without a window."""
    if not windows:
        return None
    valid = sorted((w for w in windows if w.joules is not None), key=lambda w: w.joules or 0.0)
    if not valid:
        return PointEnergy(seconds=windows[0].seconds, invalid=windows[0].invalid)
    middle = valid[(len(valid) - 1) // 2 : len(valid) // 2 + 1]
    sampled = [w.watts_sampled for w in middle]
    seconds = statistics.fmean(w.seconds for w in middle)
    try:
        return PointEnergy(
            joules=statistics.fmean(w.joules or 0.0 for w in middle),
            seconds=seconds,
            watts_sampled=None if None in sampled else statistics.fmean(s or 0.0 for s in sampled),
        )
    except ValueError:  # a figure out of any device's range: none rather than a wrong one
        return PointEnergy(seconds=seconds, invalid="the counter gave a figure out of range")


@dataclass
class _Series:
    counter: Counter
    readings: list[Reading] = field(default_factory=list)
    ended: bool = False  # read no more: it failed, or the meter stopped


class EnergyMeter:
    """The node's energy counters read while a run goes on. On enter, finds the readable
    ones (agent/energy_sources.py), reads each once and starts one daemon thread that reads
    them every `interval` seconds, and once more on exit so that the last window is covered;
    inert (no thread) where none is readable. A read that fails ends that source's series
    with what it had, never the run; a read that hangs (NVML on a GPU off the bus) leaves
    the thread behind rather than hold up exit. `nvml`, `amdsmi`: the modules (tests replay
    real values through them); `clock`: the readings' times, on time.monotonic's scale."""

    def __init__(
        self,
        *,
        nvml: Any = None,
        amdsmi: Any = None,
        powercap: Path = Path("/sys/class/powercap"),
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml, self._amdsmi, self._powercap = nvml, amdsmi, powercap
        self._interval, self._clock = interval, clock
        self._series: dict[EnergySource, _Series] = {}
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EnergyMeter:
        counters = [nvml_counter(self._nvml), amdsmi_counter(self._amdsmi)]
        counters.append(rapl_counter(self._powercap))
        self._series = {c.source: _Series(c) for c in counters if c is not None}
        self._read_each()
        # a source whose first read fails has no series and stands for no run
        self._series = {kind: s for kind, s in self._series.items() if s.readings}
        if any(not series.ended for series in self._series.values()):
            # A thread in the agent makes the in-process runner spawn its engine's process
            # rather than fork it (runners/llama_cpp_python.py): the counters stay here.
            self._thread = threading.Thread(target=self._watch, name="energy-meter", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=_HUNG_AFTER_S)
            # still alive: a read hung, and its counters are the thread's to close if it
            # ever returns; the readings taken before it stand
        with self._changed:
            self._changed.notify_all()

    def run_energy(self, *, on_accelerator: bool) -> RunEnergy | None:
        """The source standing for a run: the GPUs' (nvml, else amdsmi) for a run on an
        accelerator, the CPU's (rapl) for a run on the CPU; None where that kind has no
        readable counter."""
        series = self._source(on_accelerator)
        return (
            None
            if series is None
            else RunEnergy(source=series.counter.source, scope=series.counter.scope)
        )

    def point_energy(
        self, windows: Sequence[Window], *, on_accelerator: bool
    ) -> PointEnergy | None:
        """A point's energy over its repeats' windows (point_energy_of, window_energy); None
        where the run's source has no series, or without a window. While the meter runs,
        waits (a second or 5 intervals at most) for a reading past the last window's end."""
        series = self._source(on_accelerator)
        if series is None or not windows:
            return None
        last_end = max(end for _start, end in windows)
        with self._changed:
            self._changed.wait_for(
                lambda: (
                    series.ended
                    or self._stopping.is_set()
                    or (bool(series.readings) and series.readings[-1].at >= last_end)
                ),
                timeout=max(1.0, LONGEST_GAP_IN_INTERVALS * self._interval),
            )
            readings = list(series.readings)
        counter = series.counter
        return point_energy_of(
            [
                window_energy(
                    readings,
                    window,
                    interval=self._interval,
                    update_period_s=counter.update_period_s,
                )
                for window in windows
            ]
        )

    def _source(self, on_accelerator: bool) -> _Series | None:
        kinds: tuple[EnergySource, ...] = _ACCELERATORS if on_accelerator else ("rapl",)
        return next((self._series[kind] for kind in kinds if kind in self._series), None)

    def _watch(self) -> None:
        try:
            while not self._stopping.wait(self._interval):
                if not self._read_each():
                    return
            self._read_each()
        finally:
            for series in self._series.values():
                self._end(series)

    def _read_each(self) -> bool:
        """Reads every live source once; False once none is left."""
        for series in self._series.values():
            if series.ended:
                continue
            at = self._clock()
            try:
                joules, watts = series.counter.read()
            except Exception:  # the device or its driver failed: the series ends here
                self._end(series)
                continue
            with self._changed:
                series.readings.append(Reading(at, joules, watts))
                self._changed.notify_all()
        return any(not series.ended for series in self._series.values())

    def _end(self, series: _Series) -> None:
        if not series.ended:
            series.ended = True
            series.counter.close()
        with self._changed:
            self._changed.notify_all()
