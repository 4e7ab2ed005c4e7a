"""What a run ran on, as the registry names it: the llama.cpp build (`llama.cpp b11429
(d812350) Metal`), the binding, the hardware and the settings. The regression detector
compares runs by these labels (a change of any is a cause it can name); the curves, exports
and pages show them."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from fleetbench.contract.build_label import build_label
from fleetbench.registry.settings_label import settings_label

__all__ = [
    "RunLabels",
    "binding_label",
    "build_label",
    "run_labels",
    "runner_label",
    "serving_labels",
]


class _BindingFields(Protocol):
    @property
    def binding(self) -> str | None: ...
    @property
    def binding_version(self) -> str | None: ...


def binding_label(build: _BindingFields) -> str | None:
    if not build.binding:
        return None
    return f"{build.binding} {build.binding_version}" if build.binding_version else build.binding


class _RunnerFields(_BindingFields, Protocol):
    @property
    def engine(self) -> str: ...
    @property
    def backend(self) -> str | None: ...


def runner_label(build: _RunnerFields) -> str:
    """What ran the model, whatever its version (`llama.cpp CUDA llama-cpp-python`): runs
    on another engine, backend or binding are never compared for their outputs, nor pooled
    by compare."""
    return " ".join(part for part in (build.engine, build.backend, build.binding) if part)


def _hardware_label(description: str | None, digest: str | None) -> str | None:
    if digest is None:
        return None
    return f"{description or 'hardware'} [{digest[:8]}]"


class RunLabels(NamedTuple):
    """What a run ran on, as series compare it."""

    build: str
    binding: str | None
    hardware: str | None
    settings: str


def run_labels(
    build: Any, fingerprint_description: str | None, fingerprint_hash: str | None, settings: Any
) -> RunLabels:
    """`build` has an engine build's fields; `settings` RunSettings' (a report's, or a run
    row's)."""
    return RunLabels(
        build_label(build),
        binding_label(build),
        _hardware_label(fingerprint_description, fingerprint_hash),
        settings_label(settings),
    )


# What of a serving run's server shapes its figures besides its build: a change is a cause.
_SERVER_SETTINGS = ("slots", "ctx_per_slot", "n_ctx")


def serving_labels(
    build: Any,
    fingerprint_description: str | None,
    fingerprint_hash: str | None,
    server: dict[str, Any],
) -> RunLabels:
    """A serving run's labels: its server's build (the engine), the hardware, and the
    server's slots and context as its settings."""
    settings = " ".join(f"{k}={server[k]}" for k in _SERVER_SETTINGS if server.get(k) is not None)
    return RunLabels(
        build_label(build),
        binding_label(build),
        _hardware_label(fingerprint_description, fingerprint_hash),
        settings,
    )
