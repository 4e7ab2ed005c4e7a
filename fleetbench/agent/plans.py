"""The registry's sweep plans on a node (fleetbench.contract.plans): pulled with the ETag of
the last answer, kept on disk so a registry outage changes nothing (a daemon started while
the registry is down runs the plans it last had), and turned into the daemon's sweeps, or
into skips with the reason (a model outside the directories the node lets plans load, model
missing, sha256 mismatch, not enough memory, an engine or schedule this node cannot run, a
server it does not let plans load-test).

The daemon runs a plan's sweep exactly as a `[[sweep]]` table's: the same lock, jitter,
busy guard and spool (agent.daemon).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import psutil
from pydantic import ValidationError

from fleetbench.agent.client import RegistryClient
from fleetbench.agent.daemon_config import ServeSweepConfig, SweepConfig
from fleetbench.agent.errors import ClientError
from fleetbench.agent.gguf_model import sha256_of
from fleetbench.agent.probes.nvidia import gpu_memory
from fleetbench.agent.runners.batched_bench_binary import BINARY
from fleetbench.agent.runners.engines import UnknownEngine, engine_name
from fleetbench.agent.runners.llama_cpp_python import BINDING, binding_version
from fleetbench.contract.bounds import storable_text
from fleetbench.contract.plans import REASON_LENGTH, NodePlans, PlanModel, PlanVersion

__all__ = ["PLAN_PREFIX", "PlanCache", "PlannedSweep", "pull_plans", "resolve_plan"]

log = logging.getLogger("fleetbench.daemon")
GIB = 2**30
PLAN_PREFIX = "plan:"  # a plan's sweep is named so, beside the [[sweep]] tables' names


@dataclass(frozen=True)
class PlannedSweep:
    """A plan as this node takes it: the sweep to run, or why it is skipped."""

    plan: PlanVersion
    sweep: SweepConfig | ServeSweepConfig | None
    skipped: str | None


class PlanCache:
    """The last plans pulled and their ETag, in one JSON file written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> tuple[str | None, NodePlans] | None:
        try:
            raw = json.loads(self.path.read_text())
            return raw.get("etag"), NodePlans.model_validate(raw["plans"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning(
                "the cached plans in %s cannot be read (%s): pulling afresh", self.path, exc
            )
            return None

    def save(self, etag: str | None, plans: NodePlans) -> None:
        body = json.dumps({"etag": etag, "plans": plans.model_dump(mode="json")})
        temporary = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(body)
            os.replace(temporary, self.path)
        except OSError as exc:  # a full disk: the plans still run, from memory
            log.warning("the plans cannot be cached in %s: %s", self.path, exc)


def pull_plans(
    client: RegistryClient, cache: PlanCache, known: tuple[str | None, NodePlans] | None
) -> tuple[str | None, NodePlans] | None:
    """The plans now: pulled if they changed since `known` (then cached), else `known`.
    None only when there are none known and the registry cannot say."""
    etag = known[0] if known is not None else None
    try:
        tag, plans = client.plans(etag)
    except (ClientError, ValueError) as exc:  # unreachable, refused, or not NodePlans
        log.warning("plans not pulled (%s): keeping the %s", exc, "last" if known else "none")
        return known
    if plans is None:  # 304: unchanged
        return known
    cache.save(tag, plans)
    return tag, plans


def _node_memory_bytes() -> int:
    """What a model may occupy here: RAM and every NVIDIA GPU's memory together (llama.cpp
    splits layers across them)."""
    gpus = gpu_memory() or []  # none, or NVML failing: RAM alone
    return int(psutil.virtual_memory().total) + sum(int(gpu.total) for gpu in gpus)


def _loadable(place: str, allowed_dirs: Collection[Path]) -> bool:
    """Whether `place`, every symlink and `..` in it resolved (as the kernel would, from
    the working directory), lies in one of `allowed_dirs` (resolved already). Nothing is
    opened, and what the place holds is never said."""
    real = Path(os.path.realpath(place))
    return any(real.is_relative_to(directory) for directory in allowed_dirs)


def _find_model(
    model: PlanModel, sha256_cache: Path, allowed_dirs: Collection[Path]
) -> tuple[Path | None, str | None]:
    """(the model file, None), or (None, why it is not here). A place outside the
    directories the node allows is refused before anything there is looked at: whoever
    writes plans learns nothing of a node's other files (that one exists, its size, its
    digest), nor has it read."""
    allowed_dirs = [Path(os.path.realpath(directory)) for directory in allowed_dirs]
    for place in [*([model.path] if model.path is not None else []), *model.search_dirs]:
        if not _loadable(place, allowed_dirs):
            return None, (
                f"{place} is not in a directory this node lets plans load models from "
                "(agent.plan_model_dirs)"
            )

    def digest(path: Path) -> str:
        return sha256_of(path, cache=sha256_cache)

    if model.path is not None:
        path = Path(model.path)
        if not path.is_file():
            return None, f"model missing: {path} is not a file on this node"
        if model.sha256 is not None and (found := digest(path)) != model.sha256:
            return None, f"sha256 mismatch: {path} is {found}, the plan names {model.sha256}"
        return path, None
    for directory in map(Path, model.search_dirs):
        found_there = sorted(directory.glob("*.gguf")) if directory.is_dir() else []
        # a symlink there may lead out of the allowed directories: not followed out
        for candidate in (c for c in found_there if _loadable(str(c), allowed_dirs)):
            try:
                if digest(candidate) == model.sha256:
                    return candidate, None
            except OSError:
                continue
    searched = ", ".join(model.search_dirs)
    return None, f"model missing: no .gguf file in {searched} has sha256 {model.sha256}"


def resolve_plan(
    plan: PlanVersion,
    *,
    sha256_cache: Path,
    allowed_binaries: Collection[Path] = (),
    allowed_model_dirs: Collection[Path] = (),
    allowed_servers: Collection[str] = (),
    memory_bytes: int | None = None,
) -> PlannedSweep:
    """The sweep this node runs for the plan, or why it cannot (never raises). A plan
    runs llama-batched-bench only from a path this node allows (`plan_binaries`), never one
    found on PATH, loads a model only from a directory this node allows (`plan_model_dirs`),
    and load-tests only a server this node allows (`plan_serve_urls`): whoever writes plans
    must not choose what every node executes, which of its files it reads, nor where it
    sends load."""
    sweep: SweepConfig | ServeSweepConfig | None
    if plan.kind == "serving":
        sweep, skipped = _serving_sweep_for(plan, allowed_servers)
        return PlannedSweep(plan, sweep, skipped)
    try:
        sweep, skipped = _sweep_for(
            plan, sha256_cache, allowed_binaries, allowed_model_dirs, memory_bytes
        )
    except OSError as exc:  # a file unreadable, or gone between two looks
        sweep, skipped = None, f"model unreadable: {exc}"
    return PlannedSweep(plan, sweep, storable_text(skipped, REASON_LENGTH) if skipped else None)


def _serving_sweep_for(
    plan: PlanVersion, allowed_servers: Collection[str]
) -> tuple[ServeSweepConfig | None, str | None]:
    if plan.url not in allowed_servers:
        return None, storable_text(
            f"server {plan.url} is not one this node lets plans load-test (agent.plan_serve_urls)",
            REASON_LENGTH,
        )
    try:
        sweep = ServeSweepConfig.model_validate(
            {
                **plan.load().model_dump(),
                "name": PLAN_PREFIX + plan.name,
                "url": plan.url,
                "model": plan.model.name,
                "cron": plan.cron,
            }
        )
    except ValidationError as exc:  # a schedule this node cannot keep (30 February)
        why = "cannot run here: " + "; ".join(str(e["msg"]) for e in exc.errors())
        return None, storable_text(why, REASON_LENGTH)
    return sweep, None


def _sweep_for(
    plan: PlanVersion,
    sha256_cache: Path,
    allowed_binaries: Collection[Path],
    allowed_model_dirs: Collection[Path],
    memory_bytes: int | None,
) -> tuple[SweepConfig | None, str | None]:
    binary = Path(plan.binary) if plan.binary else None
    try:
        engine = engine_name(plan.engine, binary)
    except UnknownEngine as exc:
        return None, f"cannot run here: {exc}"
    if engine == BINARY and (binary is None or binary not in allowed_binaries):
        return None, (
            f"binary {plan.binary or BINARY + ' (on PATH)'} is not one this node allows plans "
            "to run (agent.plan_binaries)"
        )
    if plan.binding_version is not None and plan.binding_version != binding_version():
        return None, (
            f"a canary plan for {BINDING} {plan.binding_version}: this node has {binding_version()}"
        )
    path, missing = _find_model(plan.model, sha256_cache, allowed_model_dirs)
    if path is None:
        return None, missing
    memory = memory_bytes if memory_bytes is not None else _node_memory_bytes()
    size = path.stat().st_size
    if size > memory:
        return None, (
            f"not enough memory: the model file is {size / GIB:.1f} GiB, this node has "
            f"{memory / GIB:.1f} GiB (RAM and GPU memory together)"
        )
    try:
        sweep = SweepConfig.model_validate(
            {
                **plan.settings.model_dump(),
                "name": PLAN_PREFIX + plan.name,
                "model": path,
                "model_name": plan.model.name,
                "cron": plan.cron,
                "engine": plan.engine,
                "binary": plan.binary,
            }
        )
    except ValidationError as exc:
        return None, "cannot run here: " + "; ".join(str(e["msg"]) for e in exc.errors())
    return sweep, None
