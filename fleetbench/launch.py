"""The console scripts: each part's CLI, or, where the extra it needs is not installed, one
line naming that extra (a bare `pip install fleetbench` brings the contract alone)."""

from __future__ import annotations

import importlib
import sys

__all__ = ["agent", "registry"]


def _launch(module: str, extra: str, command: str) -> None:
    try:  # the CLIs import some of their libraries only when a command needs them
        importlib.import_module(module).app()
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "fleetbench":
            raise
        sys.exit(
            f"error: {command} needs {exc.name}, which comes with fleetbench[{extra}]: "
            f"pip install 'fleetbench[{extra}]'"
        )


def agent() -> None:
    _launch("fleetbench.agent.cli", "agent", "fleetbench-agent")


def registry() -> None:
    _launch("fleetbench.registry.cli", "registry", "fleetbench-registry")
