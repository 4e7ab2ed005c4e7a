"""The llama.cpp build a log announces: its `build: <number> (<commit>)` or `version:` line,
and the backend its loader lines show. Pure: lines in, an EngineBuild out."""

from __future__ import annotations

import re

from fleetbench.contract.wire import EngineBuild

__all__ = ["BuildInfo", "parse_build", "with_build"]

_BUILD_LINE = re.compile(r"^build:\s*(\w+)\s*\((\w+)\)")
_VERSION_LINE = re.compile(
    r"^version:\s*\S+\s*\(build\s+(\d+),\s*commit\s+(\w+)\)|^version:\s*(\d+)\s*\((\w+)\)"
)
_BACKEND_HINTS = (
    (re.compile(r"load_backend: loaded (\w+) backend"), None),
    (re.compile(r"ggml_cuda_init:"), "CUDA"),
    (re.compile(r"ggml_metal_(?:init|device_init)"), "Metal"),
    (re.compile(r"ggml_vulkan:"), "Vulkan"),
    (re.compile(r"ggml_hip|ROCm devices"), "ROCm"),
)


def parse_build(text: str) -> EngineBuild:
    """The llama.cpp build a log or `--version` output announces (number, commit, backend)."""
    build = BuildInfo()
    for line in text.splitlines():
        build.observe(line.strip())
    return build.engine()


class BuildInfo:
    """The build and backend a log announces; applies to the tables after it."""

    def __init__(self) -> None:
        self.number: int | None = None
        self.commit: str | None = None
        self.backend: str | None = None

    def observe(self, line: str) -> bool:
        """Takes what the line says; True when it is a build (or version) line."""
        for pattern, backend in _BACKEND_HINTS:
            if (hint := pattern.search(line)) is not None:
                self.backend = backend or hint.group(1)
                break
        if (m := _BUILD_LINE.match(line)) is not None:
            first, second = m.groups()
            # llama.cpp prints `build: <number> (<commit>)`; people also write it reversed.
            number, commit = (first, second) if first.isdigit() else (second, first)
            if number.isdigit():
                self.number, self.commit = int(number), commit
                return True
        elif (m := _VERSION_LINE.match(line)) is not None:
            number, commit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            self.number, self.commit = int(number), commit
            return True
        return False

    def engine(self) -> EngineBuild:
        # A build from a source archive, without git, says "build 0, commit unknown": no
        # build known (llama.cpp's numbers count its commits), rather than one named "0"
        return EngineBuild(
            build_number=self.number or None,
            commit=self.commit if self.commit != "unknown" else None,
            backend=self.backend,
            binding="llama-batched-bench",
        )


def with_build(engine: EngineBuild, build: EngineBuild) -> EngineBuild:
    """`engine` with what it lacks taken from the file's one build line."""
    missing = {
        name: getattr(build, name)
        for name in ("build_number", "commit", "backend")
        if getattr(engine, name) is None and getattr(build, name) is not None
    }
    return engine.model_copy(update=missing) if missing else engine
