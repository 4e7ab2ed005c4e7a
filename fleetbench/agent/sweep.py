"""A sweep in a child process, and the run report made of it.

The engine runs in a process of its own (spawned, not forked): a crash in llama.cpp (a
segfault, an abort) cannot take the agent down, and the weights are released when the
sweep ends. Each point travels back as soon as it is measured, so a sweep that dies
part-way keeps what it measured and records the failure for the rest.
"""

from __future__ import annotations

import functools
import multiprocessing
import signal
import uuid
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path

from fleetbench.agent import _proc
from fleetbench.agent.fingerprint import take_fingerprint
from fleetbench.agent.gguf_model import ModelFileError, describe_gguf, sha256_of
from fleetbench.agent.runners import PointCallback, SweepFailed, SweepOutcome, SweepSpec
from fleetbench.contract.bounds import storable_text
from fleetbench.contract.wire import (
    ERROR_LENGTH,
    REASON_LENGTH,
    SCHEMA_VERSION,
    EngineBuild,
    FailedPoint,
    HardwareFingerprint,
    ModelInfo,
    Point,
    RunReport,
    RunSettings,
)

__all__ = ["measure_run", "run_report", "sweep_in_child"]


def sweep_in_child(
    model_path: Path,
    spec: SweepSpec,
    *,
    on_point: PointCallback = lambda _: None,
    free_bytes: int | None = None,
) -> SweepOutcome:
    """Runs the in-process runner in a child process. Raises SweepFailed (with the points
    measured before) when the sweep cannot run or its process dies."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_child, args=(str(model_path), spec, free_bytes, sender), daemon=True
    )
    child.start()
    sender.close()
    points: list[Point] = []
    failures: list[FailedPoint] = []
    started: SweepOutcome | None = None
    outcome: SweepOutcome | None = None
    error: str | None = None
    while True:
        try:
            kind, payload = receiver.recv()
        except EOFError:
            break  # the child is gone, finished or not
        if kind == "point":
            point = Point.model_validate_json(payload)
            points.append(point)
            on_point(point)
        elif kind == "failure":
            failure = FailedPoint.model_validate_json(payload)
            failures.append(failure)
            on_point(failure)
        elif kind in ("start", "done"):
            told = _outcome(*payload)
            if kind == "start":
                started = told
            else:
                outcome = SweepOutcome(told.engine, told.settings, points, failures, told.model)
        else:
            error = payload
    child.join()
    if outcome is not None:
        return outcome
    raise SweepFailed(error or _death(child.exitcode), points, failures, started)


def _outcome(engine: str, settings: str, model: str | None) -> SweepOutcome:
    return SweepOutcome(
        EngineBuild.model_validate_json(engine),
        RunSettings.model_validate_json(settings),
        model=ModelInfo.model_validate_json(model) if model else None,
    )


def _told(outcome: SweepOutcome) -> tuple[str, str, str | None]:
    return (
        outcome.engine.model_dump_json(),
        outcome.settings.model_dump_json(),
        outcome.model.model_dump_json() if outcome.model else None,
    )


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"the engine's process died of {signal.Signals(-exitcode).name}"
    return f"the engine's process exited with status {exitcode}"


def _child(model_path: str, spec: SweepSpec, free_bytes: int | None, sender: Connection) -> None:
    from fleetbench.agent.runners.llama_inprocess import quiet_llama_logs, run_sweep

    quiet_llama_logs()

    def send(result: Point | FailedPoint) -> None:
        sender.send(("point" if isinstance(result, Point) else "failure", result.model_dump_json()))

    try:
        outcome = run_sweep(
            Path(model_path),
            spec,
            on_point=send,
            on_start=lambda started: sender.send(("start", _told(started))),
            free_bytes=free_bytes,
        )
    except Exception as exc:  # reported to the parent, which records the run as failed
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
    else:
        sender.send(("done", _told(outcome)))
    finally:
        sender.close()


def measure_run(
    model_path: Path,
    spec: SweepSpec,
    *,
    node: str,
    name: str | None = None,
    sha256_cache: Path | None = None,
    on_point: PointCallback = lambda _: None,
    binary: Path | None = None,
) -> RunReport:
    """A whole sweep as a run report, whatever happens: a missing or unreadable model and a
    dead engine are failed (or partial) runs, never exceptions. The model's sha256 comes from
    the cache when the file is unchanged; its architecture from llama.cpp, which loads it.
    With `binary`, the node's own llama-batched-bench runs the sweep instead."""
    name = name or model_path.name.removesuffix(".gguf")
    report = functools.partial(
        run_report, node=node, spec=spec, started_at=datetime.now(UTC), hardware=take_fingerprint()
    )
    try:
        sha256 = sha256_of(model_path, cache=sha256_cache)
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError)
        reason = f"model file not found: {model_path}" if missing else f"cannot read: {exc}"
        return report(
            model=ModelInfo(name=name), failure=ModelFileError(reason), engine=_engine(binary)
        )
    try:
        if binary is not None:
            from fleetbench.agent.runners import batched_bench_binary

            outcome = batched_bench_binary.run_sweep(
                batched_bench_binary.find_binary(binary), model_path, spec, on_point=on_point
            )
        else:
            outcome = sweep_in_child(model_path, spec, on_point=on_point)
    except SweepFailed as exc:
        read = exc.started.model if exc.started is not None else None
        return report(model=_named(read, name, sha256), failure=exc, engine=_engine(binary))
    read = outcome.model or _architecture(model_path, name, sha256_cache)
    return report(model=_named(read, name, sha256), outcome=outcome)


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


def _engine(binary: Path | None) -> EngineBuild | None:
    """What ran, for a sweep that failed before telling: the binary's build (as far as it
    can be read), or None for the in-process runner (run_report's default)."""
    if binary is None:
        return None
    from fleetbench.agent.runners import batched_bench_binary

    try:
        return batched_bench_binary.binary_build(batched_bench_binary.find_binary(binary))
    except (SweepFailed, _proc.CommandNotFound, _proc.CommandFailed):
        return EngineBuild(binding=batched_bench_binary.BINARY)


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
) -> RunReport:
    """The report of a sweep: `outcome` when it ran to the end, `failure` when it did not
    (the points measured before a crash are kept; the rest of the grid is failed)."""
    if outcome is not None:
        points, failures = outcome.points, outcome.failures
        status = "partial" if failures else "ok"
        error = None
        settings, engine = outcome.settings, outcome.engine
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
        settings = started.settings if started is not None else spec.requested_settings()
        engine = started.engine if started is not None else engine
    if not points:
        status = "failed"
        error = error or "no point could be measured"
    return RunReport(
        schema_version=SCHEMA_VERSION,
        run_id=uuid.uuid4(),
        node=node,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        status=status,
        error=error,
        source="sweep",
        engine=engine or EngineBuild(binding="llama-cpp-python"),
        model=model,
        settings=settings,
        hardware=hardware,
        points=points,
        failures=failures,
    )
