"""The agent's only way to run another program."""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["CommandFailed", "CommandNotFound", "run"]


class CommandNotFound(FileNotFoundError):
    """The program is not installed (on PATH)."""


class CommandFailed(RuntimeError):
    """The program exited non-zero, or ran past its timeout; `output` is what it printed."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def run(argv: list[str], *, timeout: float = 30.0, with_stderr: bool = False) -> str:
    """Standard output of `argv` (and standard error, in order, with `with_stderr`: llama.cpp
    prints its version there). Raises CommandNotFound or CommandFailed."""
    if shutil.which(argv[0]) is None:
        raise CommandNotFound(f"{argv[0]} is not installed")
    try:
        done = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if with_stderr else subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(f"{' '.join(argv)} ran past {timeout:g} s") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise CommandFailed(
            f"{' '.join(argv)} exited {done.returncode}: {detail[-1] if detail else ''}",
            output=done.stdout,
        )
    return done.stdout
