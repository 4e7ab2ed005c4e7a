"""A sweep as a run report: whatever the runner does, a report comes out of it (a missing
model, a dead engine and a crash part-way are failed or partial runs, never exceptions).
"""

from __future__ import annotations

import fcntl
import functools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from fleetbench.agent.contention import ContentionWatch
from fleetbench.agent.energy import EnergyMeter
from fleetbench.agent.fingerprint import THIS_AGENT, take_fingerprint
from fleetbench.agent.gguf_model import ModelFileError, describe_gguf, sha256_of
from fleetbench.agent.probes.nvidia import DeviceMemoryWatch
from fleetbench.agent.runners import (
    PointCallback,
    Runner,
    SweepFailed,
    SweepOutcome,
    SweepSpec,
    Window,
)
from fleetbench.contract.accelerator import accelerator_of, on_accelerator
from fleetbench.contract.allocation import (
    allocated_bytes,
    kv_prediction_error_pct,
    predicted_kv_bytes,
)
from fleetbench.contract.bounds import storable_text
from fleetbench.contract.wire import (
    ERROR_LENGTH,
    REASON_LENGTH,
    SCHEMA_VERSION,
    Contention,
    DeviceMemoryUse,
    EngineBuild,
    FailedPoint,
    HardwareFingerprint,
    ModelInfo,
    Point,
    RunEnergy,
    RunReport,
)

__all__ = ["energy_line", "measure_run", "memory_line", "run_report", "sweep_lock"]


@contextmanager
def sweep_lock(path: Path) -> Iterator[bool]:
    """Holds an exclusive lock on `path` (never waits): True if this process got it. A lock
    file, so that two daemons (or a daemon and a manual sweep) never measure at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def measure_run(
    model_path: Path,
    spec: SweepSpec,
    runner: Runner,
    *,
    node: str,
    name: str | None = None,
    sha256_cache: Path | None = None,
    on_point: PointCallback = lambda _: None,
    gpu_memory: DeviceMemoryWatch | None = None,
    contention: ContentionWatch | None = None,
    energy: EnergyMeter | None = None,
) -> RunReport:
    """A whole sweep on `runner` as a run report. The model's sha256 comes from the cache
    when the file is unchanged; its architecture from the engine when it reads it, else
    from the file's header; each NVIDIA GPU's memory in use from `gpu_memory` (default:
    NVML read every 0.5 s); what else used the node meanwhile from `contention` (the
    figures: the caller judges them with its settings, contention.judged); each point's
    energy from `energy` (default: the node's counters, where it can read any)."""
    name = name or model_path.name.removesuffix(".gguf")
    hardware = take_fingerprint()
    report = functools.partial(
        run_report, node=node, spec=spec, started_at=datetime.now(UTC), hardware=hardware
    )
    try:
        sha256 = sha256_of(model_path, cache=sha256_cache)
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError)
        reason = f"model file not found: {model_path}" if missing else f"cannot read: {exc}"
        return report(
            model=ModelInfo(name=name), failure=ModelFileError(reason), engine=runner.engine()
        )
    watch = gpu_memory or DeviceMemoryWatch()
    others = contention or ContentionWatch()
    meter = energy or EnergyMeter()
    try:
        # all ended before their figures are taken, whichever way the sweep ends
        with others, watch, meter:
            outcome = runner.run(model_path, spec, on_point=on_point)
    except SweepFailed as exc:
        read = exc.started.model if exc.started is not None else None
        ran = exc.started or SweepOutcome(runner.engine(), spec.run_settings())
        exc.points, spent = _with_energy(exc.points, exc.windows, meter, ran, hardware)
        return report(
            model=_named(read, name, sha256),
            failure=exc,
            engine=runner.engine(),
            device_memory=watch.readings(),
            contention=others.figures(),
            energy=spent,
        )
    read = outcome.model or _architecture(model_path, name, sha256_cache)
    outcome.points, spent = _with_energy(outcome.points, outcome.windows, meter, outcome, hardware)
    return report(
        model=_named(read, name, sha256),
        outcome=outcome,
        device_memory=watch.readings(),
        contention=others.figures(),
        energy=spent,
    )


def _with_energy(
    points: list[Point],
    windows: dict[tuple[int, int, int], list[Window]],
    meter: EnergyMeter,
    ran: SweepOutcome,
    hardware: HardwareFingerprint,
) -> tuple[list[Point], RunEnergy | None]:
    """The points with what each cost in energy, and the source of the figures (None where
    the node cannot count what the run used: then no point has energy). A run on a GPU is
    counted by the GPUs' counters, a run on the CPU (of any node) by the CPU's; a run on a
    node with a GPU whose engine did not say what it ran on, by neither."""
    used_accelerator, _ = on_accelerator(
        hardware.data, ran.engine.backend, ran.settings.n_gpu_layers
    )
    if used_accelerator is None and accelerator_of(hardware.data) is not None:
        return points, None
    gpu = used_accelerator is True
    source = meter.run_energy(on_accelerator=gpu)
    if source is None:
        return points, None
    measured = [
        point.model_copy(
            update={
                "energy": meter.point_energy(
                    windows.get((point.pp, point.tg, point.b), []), on_accelerator=gpu
                )
            }
        )
        for point in points
    ]
    return measured, source


def _named(read: ModelInfo | None, name: str, sha256: str) -> ModelInfo:
    """What the engine (or the file's header) read of the model, under the run's name."""
    return (read or ModelInfo(name=name)).model_copy(update={"name": name, "sha256": sha256})


def _architecture(model_path: Path, name: str, sha256_cache: Path | None) -> ModelInfo | None:
    """What a runner that does not say (the node's binary) leaves out: the architecture
    numbers from the file's header, so placement can check a binary run's KV fit too."""
    try:
        return describe_gguf(model_path, name=name, sha256_cache=sha256_cache)
    except ModelFileError:
        return None


def run_report(
    *,
    node: str,
    model: ModelInfo,
    spec: SweepSpec,
    started_at: datetime,
    outcome: SweepOutcome | None = None,
    failure: SweepFailed | Exception | None = None,
    hardware: HardwareFingerprint | None = None,
    engine: EngineBuild | None = None,
    device_memory: list[DeviceMemoryUse] | None = None,
    contention: Contention | None = None,
    energy: RunEnergy | None = None,
) -> RunReport:
    """The report of a sweep: `outcome` when it ran to the end, `failure` when it did not
    (the points measured before a crash are kept; the rest of the grid is failed). `engine`:
    what ran, for a failure the engine said nothing of; `device_memory`: its GPUs' memory
    in use, where NVML reads it; `contention`: what else used the node meanwhile; `energy`:
    where its points' energy figures come from."""
    if outcome is not None:
        points, failures = outcome.points, outcome.failures
        status = "partial" if failures else "ok"
        error = None
        settings, engine, buffers = outcome.settings, outcome.engine, outcome.buffers
        outputs = outcome.outputs
    else:
        assert failure is not None
        points = getattr(failure, "points", [])
        measured = {(p.pp, p.tg, p.b) for p in points}
        failed = list(getattr(failure, "failures", []))
        failed_keys = {(f.pp, f.tg, f.b) for f in failed}
        reason = storable_text(str(failure), REASON_LENGTH)
        failures = failed + [
            FailedPoint(pp=pp, tg=tg, b=b, reason=reason)
            for pp, tg, b in spec.grid()
            if (pp, tg, b) not in measured and (pp, tg, b) not in failed_keys
        ]
        status = "partial" if points else "failed"
        error = storable_text(str(failure), ERROR_LENGTH)
        # What the engine said it ran with, so a crashed run's points are labelled as a
        # finished run's would be (settings that seem to change twice around it would cost
        # the regression check its evidence); else the settings asked for.
        started = getattr(failure, "started", None)
        settings = started.settings if started is not None else spec.run_settings()
        engine = started.engine if started is not None else engine
        buffers = started.buffers if started is not None else []
        outputs = None
    if not points:
        status = "failed"
        error = error or "no point could be measured"
    return RunReport(
        schema_version=SCHEMA_VERSION,
        agent=THIS_AGENT,
        run_id=uuid.uuid4(),
        node=node,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        status=status,
        error=error,
        source="sweep",
        engine=engine or EngineBuild(),
        model=model,
        settings=settings,
        hardware=hardware,
        points=points,
        failures=failures,
        buffers=buffers,
        device_memory=device_memory or [],
        contention=contention,
        energy=energy if any(p.energy is not None for p in points) else None,
        outputs=outputs,
    )


def energy_line(report: RunReport) -> str | None:
    """What counted the points' energy and what it covers, and the points it gave no figure
    with the first reason (None: nothing was counted), e.g. "energy counted by nvml (GPU
    board: 0 (NVIDIA H100 80GB HBM3)); 1 point without a figure: 0.42 s is too short for a
    counter read every 0.1 s"."""
    if report.energy is None:
        return None
    line = f"energy counted by {report.energy.source} ({report.energy.scope})"
    refused = [p.energy.invalid for p in report.points if p.energy and p.energy.invalid]
    if refused:
        many = "s" if len(refused) != 1 else ""
        line += f"; {len(refused)} point{many} without a figure: {refused[0]}"
    return line


def memory_line(report: RunReport) -> str | None:
    """What llama.cpp allocated, beside the KV cache the maths predicted, and what each GPU
    had in use (None: neither is known), e.g. "memory llama.cpp allocated: weights 241.1
    MiB, KV cache 18.0 MiB (predicted 18.0, +0.0%); GPU0 in use: 1.2 GiB at most, 0.4 before
    the sweep, of 80.0"."""
    parts = []
    for kind, label in (("model", "weights"), ("kv", "KV cache"), ("compute", "compute")):
        size = allocated_bytes(report.buffers, kind)
        if size is None:
            continue
        part = f"{label} {size / 2**20:.1f} MiB"
        predicted = predicted_kv_bytes(report) if kind == "kv" else None
        if (error := kv_prediction_error_pct(predicted, size)) is not None:
            assert predicted is not None
            part += f" (predicted {predicted / 2**20:.1f}, {error:+.1f}%)"
        parts.append(part)
    lines = ["memory llama.cpp allocated: " + ", ".join(parts)] if parts else []
    lines += [
        f"GPU{use.gpu} in use: {use.peak_bytes / 2**30:.1f} GiB at most, "
        f"{use.before_bytes / 2**30:.1f} before the sweep, of {use.total_bytes / 2**30:.1f}"
        for use in report.device_memory
    ]
    return "; ".join(lines) or None
