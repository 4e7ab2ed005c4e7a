"""The in-process engine as a runner: llama-batched-bench's loop (runners/llama_inprocess.py)
on llama-cpp-python, in a child process.

The child is a process of its own: a crash in llama.cpp (a segfault, an abort) cannot take
the agent down, and the weights are released when the sweep ends. Each point travels back
as soon as it is measured, so a sweep that dies part-way keeps what it measured and what it
was measured with, and records the failure for the rest.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import multiprocessing
import signal
import sys
import threading
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, SpawnContext
from pathlib import Path

from fleetbench.agent.errors import EngineUnavailable
from fleetbench.agent.runners import (
    PointCallback,
    SweepFailed,
    SweepOutcome,
    SweepSpec,
    Window,
)
from fleetbench.agent.runners.repeats import Key
from fleetbench.contract.outputs import OutputFingerprint
from fleetbench.contract.wire import (
    AllocatedBuffer,
    EngineBuild,
    FailedPoint,
    ModelInfo,
    Point,
    RunSettings,
)

__all__ = ["BINDING", "LlamaCppPythonRunner", "binding_version"]

BINDING = "llama-cpp-python"
MISSING = (
    "the in-process engine needs llama-cpp-python, which fleetbench[agent] leaves out: "
    "pip install 'fleetbench[llama]' (it compiles llama.cpp), or sweep with --binary and "
    "the node's own llama-batched-bench"
)


class LlamaCppPythonRunner:
    """Runs the sweep in-process on llama-cpp-python. `free_bytes`: the memory the points'
    KV caches are checked against (default: what the device has free when the model is
    loaded)."""

    def __init__(self, *, free_bytes: int | None = None) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise EngineUnavailable(MISSING)
        self.free_bytes = free_bytes

    def identity(self) -> dict[str, str]:
        # The binding's version fixes the llama.cpp it vendors.
        return {BINDING: binding_version()}

    def engine(self) -> EngineBuild:
        return EngineBuild(binding=BINDING, binding_version=binding_version())

    def run(
        self, model_path: Path, spec: SweepSpec, *, on_point: PointCallback = lambda _: None
    ) -> SweepOutcome:
        """Raises SweepFailed (with the points measured before, and what the engine said it
        runs with) when the sweep cannot run or its process dies."""
        context = _process_context()
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(
            target=_child, args=(str(model_path), spec, self.free_bytes, sender), daemon=True
        )
        sys.stdout.flush()  # a forked child flushes what it inherited when it ends
        sys.stderr.flush()
        child.start()
        sender.close()
        points: list[Point] = []
        failures: list[FailedPoint] = []
        # the child's time.monotonic() is this process's: the same system-wide clock
        windows: dict[Key, list[Window]] = {}
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
            elif kind == "window":
                key, window = payload
                windows.setdefault(tuple(key), []).append(tuple(window))
            elif kind == "failure":
                failure = FailedPoint.model_validate_json(payload)
                failures.append(failure)
                on_point(failure)
            elif kind in ("start", "done"):
                told = _outcome(*payload)
                if kind == "start":
                    started = told
                else:
                    outcome = SweepOutcome(
                        told.engine,
                        told.settings,
                        points,
                        failures,
                        told.model,
                        told.buffers,
                        windows,
                        told.outputs,
                    )
            else:
                error = payload
        child.join()
        if outcome is not None:
            return outcome
        raise SweepFailed(error or _death(child.exitcode), points, failures, started, windows)


def _process_context() -> SpawnContext | ForkContext:
    """fork where it is safe, spawn elsewhere. A forked child starts with what this process
    has imported (0.4 s of a CLI sweep's start, spent again by a spawned one), but a fork
    copies only the thread that forks: with other threads running (the daemon's scheduler
    and delivery) a lock one of them holds stays held in the child for ever. macOS forks
    badly whatever the threads (its system frameworks), as Python's own default says. Native
    threads are not counted here: none runs in the agent before the engine is loaded, which
    happens in the child. The child also holds what the agent held open, the sweep lock
    among them: an agent killed mid-sweep leaves the lock held until its engine ends."""
    if sys.platform == "darwin" or threading.active_count() > 1:
        return multiprocessing.get_context("spawn")
    return multiprocessing.get_context("fork")


def binding_version() -> str:
    """The binding's version, read without loading llama.cpp into the agent's process."""
    try:
        return importlib.metadata.version(BINDING)
    except importlib.metadata.PackageNotFoundError:  # importable, installed another way
        return "unknown"


def _outcome(
    engine: str, settings: str, model: str | None, buffers: list[str], outputs: str | None
) -> SweepOutcome:
    return SweepOutcome(
        EngineBuild.model_validate_json(engine),
        RunSettings.model_validate_json(settings),
        model=ModelInfo.model_validate_json(model) if model else None,
        buffers=[AllocatedBuffer.model_validate_json(b) for b in buffers],
        outputs=OutputFingerprint.model_validate_json(outputs) if outputs else None,
    )


def _told(outcome: SweepOutcome) -> tuple[str, str, str | None, list[str], str | None]:
    return (
        outcome.engine.model_dump_json(),
        outcome.settings.model_dump_json(),
        outcome.model.model_dump_json() if outcome.model else None,
        [b.model_dump_json() for b in outcome.buffers],
        outcome.outputs.model_dump_json() if outcome.outputs else None,
    )


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"the engine's process died of {signal.Signals(-exitcode).name}"
    return f"the engine's process exited with status {exitcode}"


def _child(model_path: str, spec: SweepSpec, free_bytes: int | None, sender: Connection) -> None:
    from fleetbench.agent.runners.llama_buffers import BufferLog
    from fleetbench.agent.runners.llama_inprocess import capture_llama_log, run_sweep

    capture_llama_log(BufferLog())

    def send(result: Point | FailedPoint) -> None:
        sender.send(("point" if isinstance(result, Point) else "failure", result.model_dump_json()))

    try:
        outcome = run_sweep(
            Path(model_path),
            spec,
            on_point=send,
            on_start=lambda started: sender.send(("start", _told(started))),
            on_window=lambda key, window: sender.send(("window", (key, window))),
            free_bytes=free_bytes,
        )
    except Exception as exc:  # reported to the parent, which records the run as failed
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
    else:
        sender.send(("done", _told(outcome)))
    finally:
        sender.close()
