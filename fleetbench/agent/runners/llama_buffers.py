"""The memory llama.cpp says it allocated, read from its log.

Every context llama.cpp creates logs its buffers at the info level, one line each, whether
the log goes to a log callback (in-process) or to a tool's stderr (`--binary`, behind the
tool's time and level prefix, and only when its log verbosity admits info: see
`VERBOSE_ENV`):

    load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
    llama_kv_cache:        CPU KV buffer size =     6.00 MiB
    llama_context:        CPU  output buffer size =     2.00 MiB
    sched_reserve:        CPU compute buffer size =   514.50 MiB

The sizes are in MiB with two decimals: each is known to ±5 KiB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import ValidationError

from fleetbench.contract.wire import AllocatedBuffer

__all__ = ["VERBOSE_ENV", "BufferLog", "buffers_in"]

# llama.cpp's tools log warnings only by default. An environment variable, which a build
# that predates it ignores (a flag would fail it), lets the buffer lines through: level 4
# (level 3, "info", let none through in the vendored build; 4 did).
VERBOSE_ENV = {"LLAMA_ARG_LOG_VERBOSITY": "4"}

_LINE = re.compile(
    r"\b\w+:\s+(?P<device>\S+)\s+(?P<kind>model|KV|compute|output) buffer size =\s*"
    r"(?P<mib>\d+(?:\.\d+)?) MiB\s*$"
)
_KINDS = {"model": "model", "KV": "kv", "compute": "compute", "output": "output"}


def buffers_in(lines: Iterable[str]) -> list[AllocatedBuffer]:
    """The buffers logged in `lines`, in the order llama.cpp allocated them; a line the
    report could not carry (a buffer type's name over 64 characters, a size beyond any
    memory) is left out rather than failing the sweep."""
    found = []
    for line in lines:
        if match := _LINE.search(line.strip()):
            try:
                buffer = AllocatedBuffer(
                    kind=_KINDS[match["kind"]],
                    device=match["device"],
                    bytes=round(float(match["mib"]) * 2**20),
                )
            except ValidationError:
                continue
            found.append(buffer)
    return found


class BufferLog:
    """Collects the buffer lines of llama.cpp's log callback, which hands over a message in
    pieces at times: text is joined until a newline ends a line."""

    def __init__(self) -> None:
        self._pending = ""
        self._lines: list[str] = []

    def write(self, text: str) -> None:
        self._pending += text
        *complete, self._pending = self._pending.split("\n")
        self._lines.extend(line for line in complete if "buffer size" in line)

    def buffers(self) -> list[AllocatedBuffer]:
        return buffers_in(self._lines)
