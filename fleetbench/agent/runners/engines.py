"""The engines a sweep can run on, by name: the name a CLI option or a `[[sweep]]` table
gives (`engine = "llama-batched-bench"`) is the binding a run report names. A new engine is
a module in runners/ with a class that has `Runner`'s three methods, and one line here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleetbench.agent.runners import Runner
from fleetbench.agent.runners.batched_bench_binary import BINARY, BatchedBenchBinaryRunner
from fleetbench.agent.runners.llama_cpp_python import BINDING, LlamaCppPythonRunner

__all__ = ["ENGINES", "UnknownEngine", "engine_name", "runner_for"]

# Each makes its runner from the node's binary, when the engine runs one.
ENGINES: dict[str, Callable[[Path | None], Runner]] = {
    BINDING: lambda _binary: LlamaCppPythonRunner(),
    BINARY: BatchedBenchBinaryRunner,
}


class UnknownEngine(ValueError):
    """An engine name no runner answers to, or a binary given to an engine without one."""


def engine_name(engine: str | None, binary: Path | None) -> str:
    """The engine to run: the one named, else the node's binary when one is given, else
    llama.cpp in-process. Raises UnknownEngine."""
    name = engine or (BINARY if binary is not None else BINDING)
    if name not in ENGINES:
        raise UnknownEngine(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
    if binary is not None and name != BINARY:
        raise UnknownEngine(f"engine {name!r} runs no binary: leave out the binary")
    return name


def runner_for(engine: str | None = None, binary: Path | None = None) -> Runner:
    """The runner of an engine (engine_name's choice). Raises UnknownEngine, or
    EngineUnavailable when the engine is not installed here."""
    return ENGINES[engine_name(engine, binary)](binary)
