"""The machine's fingerprint: a stable hash of what defines it, and everything the probes saw;
and the agent's own identity, which every report carries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from fleetbench.agent.probes import ProbeResult, run_probes
from fleetbench.contract.wire import AgentIdentity, HardwareFingerprint
from fleetbench.version import VERSION

__all__ = ["THIS_AGENT", "fingerprint_of", "take_fingerprint"]

THIS_AGENT = AgentIdentity(version=VERSION)


def take_fingerprint(probes: Iterable[str] | None = None) -> HardwareFingerprint:
    """Runs the probes (default: those enabled by default) and fingerprints the results."""
    return fingerprint_of(run_probes(probes))


def fingerprint_of(results: Iterable[ProbeResult]) -> HardwareFingerprint:
    """The hash covers each probe's identity keys only (never hostnames, free memory, clocks
    or temperatures), so a reboot keeps it and new hardware or a new driver changes it. A
    probe that failed is named in it: an incomplete fingerprint never passes for a complete
    one."""
    identity: dict[str, Any] = {}
    data: dict[str, Any] = {"probes": {}, "notes": {}}
    for result in results:
        if result.collected is not None:
            found = result.collected.data
            identity[result.name] = {k: found.get(k) for k in result.collected.identity}
            data["probes"][result.name] = found
        elif not result.ok:
            identity[result.name] = "failed"
        if result.note:
            data["notes"][result.name] = result.note
    data["complete"] = all(value != "failed" for value in identity.values())
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return HardwareFingerprint(hash=digest, data=data)
