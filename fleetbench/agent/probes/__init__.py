"""Hardware probes: one module per kind of hardware, each registered by name.

A probe's `collect()` returns what it found as plain JSON-able data, and names the keys that
define the machine (`identity`): the fingerprint hashes only those, so free memory, clocks or
temperatures never change it, while new hardware or a new driver does. A probe raises NoData
when the machine has no such hardware; any other exception is a failed probe, recorded as a
note, never a failed fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "PROBES",
    "Collected",
    "NoData",
    "Probe",
    "ProbeResult",
    "ProbeSpec",
    "register",
    "run_probes",
]


class NoData(Exception):
    """This machine has no hardware of the probe's kind: not a failure."""


@dataclass(frozen=True)
class Collected:
    """What a probe found, which of its keys define the machine, and what it could not
    find of its hardware (e.g. a GPU's memory bandwidth), for the fingerprint's notes."""

    data: dict[str, Any]
    identity: tuple[str, ...]
    note: str | None = None


class Probe(Protocol):
    def collect(self) -> Collected: ...


@dataclass(frozen=True)
class ProbeSpec:
    factory: Callable[[], Probe]
    default_enabled: bool


@dataclass
class ProbeResult:
    name: str
    ok: bool
    collected: Collected | None = None
    note: str | None = None  # why there is nothing: no such hardware, or the error


PROBES: dict[str, ProbeSpec] = {}


def register(name: str, *, default_enabled: bool = True) -> Callable[[type], type]:
    def add(cls: type) -> type:
        PROBES[name] = ProbeSpec(cls, default_enabled)
        return cls

    return add


def run_probes(enabled: Iterable[str] | None = None) -> list[ProbeResult]:
    """Runs the enabled probes (default: those enabled by default); never raises."""
    _load_builtin_probes()
    names = (
        list(enabled)
        if enabled is not None
        else [name for name, spec in PROBES.items() if spec.default_enabled]
    )
    results = []
    for name in names:
        spec = PROBES.get(name)
        if spec is None:
            results.append(ProbeResult(name, False, note=f"no probe named {name!r}"))
            continue
        try:
            collected = spec.factory().collect()
        except NoData as exc:
            results.append(ProbeResult(name, True, note=str(exc)))
        except Exception as exc:  # a probe's failure is data, never the agent's
            results.append(ProbeResult(name, False, note=f"{type(exc).__name__}: {exc}"))
        else:
            results.append(ProbeResult(name, True, collected, note=collected.note))
    return results


def _load_builtin_probes() -> None:
    # Importing a probe module registers it.
    from fleetbench.agent.probes import amd, apple, host, nvidia  # noqa: F401
