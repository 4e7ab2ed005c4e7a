"""The llama.cpp build as people name it (`llama.cpp b11429 (d812350) Metal`): what the
registry's pages, exports and regression causes show, and the agent's import says."""

from __future__ import annotations

from typing import Protocol

__all__ = ["build_label"]


class _BuildFields(Protocol):
    @property
    def engine(self) -> str: ...
    @property
    def build_number(self) -> int | None: ...
    @property
    def commit(self) -> str | None: ...
    @property
    def backend(self) -> str | None: ...


def build_label(build: _BuildFields) -> str:
    """The llama.cpp build as people name it: `llama.cpp b11429 (d812350) Metal`."""
    parts = [build.engine]
    if build.build_number is not None:
        parts.append(f"b{build.build_number}")
    if build.commit:
        parts.append(
            f"({build.commit[:7]})" if build.build_number is not None else build.commit[:12]
        )
    if build.backend:
        parts.append(build.backend)
    return " ".join(parts)
