"""The figures a build comparison reads: each node's runs of the model with either build,
aggregated per node x hardware x settings x build x point in SQL (a 1,000-node fleet's
comparison reads one row per node, build and point, not every run's points); serving runs
(a handful per node) are read as rows and aggregated here."""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Select, bindparam, func, select
from sqlalchemy.orm import Session

from fleetbench.registry.labels import SETTING_NAMES, binding_label, build_label
from fleetbench.registry.models import (
    RUN_SERVED,
    RUN_SUCCESSFUL,
    EngineBuild,
    HardwareFingerprint,
    Node,
    Run,
    RunPoint,
    ServingPointRow,
)
from fleetbench.registry.questions.compare import PointKey, SideFigures

__all__ = [
    "BuildSelection",
    "Group",
    "build_matches",
    "offline_groups",
    "select_builds",
    "serving_groups",
]

Side = Literal["before", "after"]
SERVING_METRICS = ("per_user_tps_p10", "ttft_ms_p90")
_DIGITS = re.compile(r"[0-9]+")  # ASCII digits: str.isdigit() takes '²', which int() refuses


def build_matches(selector: str, build: EngineBuild) -> bool:
    """Whether a build is the one a user named: its build number (`b4567` or `4567`), its
    commit (7 hex digits or more, a prefix), its binding's version (`0.3.16`, or
    `llama-cpp-python 0.3.16`), or its whole label (`llama.cpp b4567 (abc1234) CUDA`)."""
    wanted = selector.strip()
    number = wanted[1:] if wanted[:1] in ("b", "B") else wanted
    if _DIGITS.fullmatch(number) and int(number) == build.build_number:
        return True  # (digits alone may also be a commit's first seven: tried next)
    if (
        len(wanted) >= 7
        and build.commit
        and all(c in "0123456789abcdefABCDEF" for c in wanted)
        and build.commit.lower().startswith(wanted.lower())
    ):
        return True
    return wanted in (build.binding_version, binding_label(build), build_label(build))


@dataclass(frozen=True)
class BuildSelection:
    before_ids: frozenset[int]
    after_ids: frozenset[int]
    before_labels: tuple[str, ...]
    after_labels: tuple[str, ...]
    both_labels: tuple[str, ...]  # builds both names match, left out of both
    # what runs each build ran on, whatever its version: runs on another backend or engine
    # (CUDA beside Vulkan, a binary beside in-process) are never pooled or compared
    runners: dict[int, str]


def select_builds(session: Session, before: str, after: str) -> BuildSelection:
    """The engine builds each selector names (builds both name are left out of both)."""
    builds = session.scalars(select(EngineBuild)).all()
    first = {b.id: b for b in builds if build_matches(before, b)}
    second = {b.id: b for b in builds if build_matches(after, b)}
    both = first.keys() & second.keys()
    return BuildSelection(
        frozenset(first.keys() - both),
        frozenset(second.keys() - both),
        tuple(sorted({build_label(b) for i, b in first.items() if i not in both})),
        tuple(sorted({build_label(b) for i, b in second.items() if i not in both})),
        tuple(sorted({build_label(first[i]) for i in both})),
        {i: _runner(b) for i, b in (first | second).items()},
    )


def _runner(build: EngineBuild) -> str:
    return " ".join(part for part in (build.engine, build.backend, build.binding) if part)


@dataclass
class Group:
    """A node's runs on one hardware and settings: each build's figures per point."""

    node: str
    hardware: str | None
    hardware_hash: str | None
    settings: str
    sides: dict[Side, dict[PointKey, SideFigures]] = field(
        default_factory=lambda: {"before": {}, "after": {}}
    )
    runs: dict[Side, int] = field(default_factory=lambda: {"before": 0, "after": 0})


def _spread(runs: int, mean: float, mean_of_squares: float) -> float | None:
    """The relative standard deviation between runs, from their mean and mean square."""
    if runs < 2 or mean <= 0:
        return None
    variance = max(0.0, mean_of_squares - mean * mean) * runs / (runs - 1)
    return math.sqrt(variance) / mean


def _settings_label(values: Sequence[Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in zip(SETTING_NAMES, values, strict=True) if v is not None)


_LEADING = ("node_id", "fingerprint_id")  # the columns before the settings in a row


@functools.cache
def _offline_statement(since: bool) -> Select[Any]:
    # Grouped by ids, not names: a narrow key PostgreSQL hashes rather than sorts (each run
    # has one point per PP x TG x B, so a group's rows are its runs).
    keys = (
        *(getattr(Run, k) for k in _LEADING),
        *(getattr(Run, k) for k in SETTING_NAMES),
        Run.build_id,
        RunPoint.pp,
        RunPoint.tg,
        RunPoint.b,
    )
    statement = (
        select(
            *keys,
            func.count(RunPoint.s_tg).label("s_tg_runs"),
            func.avg(RunPoint.s_tg).label("s_tg"),
            func.avg(RunPoint.s_tg * RunPoint.s_tg).label("s_tg_sq"),
            func.count(RunPoint.s_pp).label("s_pp_runs"),
            func.avg(RunPoint.s_pp).label("s_pp"),
            func.avg(RunPoint.s_pp * RunPoint.s_pp).label("s_pp_sq"),
            # the points' own repeats: their deviation (relative to the mean, here) and count
            func.avg(RunPoint.s_tg_stdev).label("s_tg_sd"),
            func.avg(RunPoint.s_pp_stdev).label("s_pp_sd"),
            func.avg(RunPoint.repeats).label("repeats"),
        )
        .select_from(Run)
        .join(RunPoint, RunPoint.run_id == Run.id)
        .where(
            Run.model_id.in_(bindparam("model_ids", expanding=True)),
            Run.build_id.in_(bindparam("build_ids", expanding=True)),
            RUN_SUCCESSFUL,
        )
        .group_by(*keys)
    )
    if since:
        statement = statement.where(Run.started_at >= bindparam("since"))
    return statement


_NAMES = select(Node.id, Node.name).where(Node.id.in_(bindparam("ids", expanding=True)))
_FINGERPRINTS = select(
    HardwareFingerprint.id, HardwareFingerprint.hash, HardwareFingerprint.description
).where(HardwareFingerprint.id.in_(bindparam("ids", expanding=True)))


@dataclass
class _Sums:
    """One side's sums at one point (a side may hold several builds: one name, backends)."""

    runs: int = 0
    total: float = 0.0
    squares: float = 0.0
    rsd: float = 0.0  # the repeats' relative deviations, summed over runs with repeats
    repeats: float = 0.0
    repeated: int = 0

    def figures(self) -> SideFigures:
        mean = self.total / self.runs
        noise = None
        if self.repeated and self.repeats / self.repeated >= 2:
            noise = self.rsd / self.repeated / math.sqrt(self.repeats / self.repeated)
        return SideFigures(
            self.runs, mean, _spread(self.runs, mean, self.squares / self.runs), noise
        )


def _parameters(
    model_ids: Collection[int], builds: BuildSelection, since: datetime | None
) -> dict[str, Any]:
    """The bound values of either kind's statement (`since` only where it is asked)."""
    found: dict[str, Any] = {
        "model_ids": list(model_ids),
        "build_ids": [*builds.before_ids, *builds.after_ids],
    }
    if since is not None:
        found["since"] = since
    return found


def offline_groups(
    connection: Connection,
    *,
    model_ids: Collection[int],
    builds: BuildSelection,
    since: datetime | None,
) -> list[Group]:
    parameters = _parameters(model_ids, builds, since)
    rows = connection.execute(_offline_statement(since is not None), parameters).all()
    names = {
        r.id: r.name for r in connection.execute(_NAMES, {"ids": list({r.node_id for r in rows})})
    }
    fingerprints = {
        r.id: (r.hash, r.description)
        for r in connection.execute(
            _FINGERPRINTS, {"ids": list({r.fingerprint_id for r in rows} - {None})}
        )
    }
    first_setting = len(_LEADING)
    labels: dict[tuple[Any, ...], str] = {}  # a settings label made once per distinct tuple
    groups: dict[tuple[int, int | None, str], Group] = {}
    sums: dict[tuple[int, int | None, str], dict[Side, dict[PointKey, _Sums]]] = {}
    for row in rows:
        values = tuple(row[first_setting : first_setting + len(SETTING_NAMES)])
        settings = labels.get(values)
        if settings is None:
            settings = labels[values] = _settings_label(values)
        runner = builds.runners[row.build_id]
        key = (row.node_id, row.fingerprint_id, f"{settings} on {runner}".strip())
        if key not in groups:
            hash_, described = fingerprints.get(row.fingerprint_id, (None, None))
            groups[key] = Group(names[row.node_id], described, hash_, key[2])
            sums[key] = {"before": defaultdict(_Sums), "after": defaultdict(_Sums)}
        side: Side = "after" if row.build_id in builds.after_ids else "before"
        for metric, runs, mean, squares, sd in (
            ("s_tg", row.s_tg_runs, row.s_tg, row.s_tg_sq, row.s_tg_sd),
            ("s_pp", row.s_pp_runs, row.s_pp, row.s_pp_sq, row.s_pp_sd),
        ):
            if not runs or mean is None or mean <= 0:
                continue
            found = sums[key][side][PointKey(metric, row.pp, row.tg, row.b)]
            found.runs += runs
            found.total += runs * float(mean)
            found.squares += runs * float(squares)
            if sd is not None and row.repeats:
                found.rsd += runs * float(sd) / float(mean)
                found.repeats += runs * float(row.repeats)
                found.repeated += runs
    for key, group in groups.items():
        for side in ("before", "after"):
            points = sums[key][side]
            group.sides[side] = {cell: found.figures() for cell, found in points.items()}
            group.runs[side] = max((f.runs for f in points.values()), default=0)
    return list(groups.values())


@functools.cache
def _serving_statement(since: bool) -> Select[Any]:
    statement = (
        select(
            Node.name,
            HardwareFingerprint.hash,
            HardwareFingerprint.description,
            Run.id,
            Run.build_id,
            Run.server,
            ServingPointRow.concurrency,
            *(getattr(ServingPointRow, m) for m in SERVING_METRICS),
        )
        .select_from(Run)
        .join(Node, Node.id == Run.node_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .join(ServingPointRow, ServingPointRow.run_id == Run.id)
        .where(
            Run.model_id.in_(bindparam("model_ids", expanding=True)),
            Run.build_id.in_(bindparam("build_ids", expanding=True)),
            RUN_SERVED,
        )
    )
    if since:
        statement = statement.where(Run.started_at >= bindparam("since"))
    return statement


# What of a server, besides its build, shapes its figures: runs compared must share it.
_SERVER_SHAPE = ("kind", "slots", "ctx_per_slot", "n_ctx", "prompt_tokens", "gen_tokens")


def serving_groups(
    connection: Connection,
    *,
    model_ids: Collection[int],
    builds: BuildSelection,
    since: datetime | None,
) -> list[Group]:
    parameters = _parameters(model_ids, builds, since)
    values: dict[tuple[str, str | None, str], dict[Side, dict[PointKey, list[float]]]] = {}
    runs: dict[tuple[str, str | None, str], dict[Side, set[Any]]] = {}
    described: dict[tuple[str, str | None, str], str | None] = {}
    for row in connection.execute(_serving_statement(since is not None), parameters):
        server = row.server or {}
        shape = " ".join(f"{k}={server[k]}" for k in _SERVER_SHAPE if server.get(k) is not None)
        key = (row.name, row.hash, f"{shape} on {builds.runners[row.build_id]}")
        side: Side = "after" if row.build_id in builds.after_ids else "before"
        described[key] = row.description
        runs.setdefault(key, {"before": set(), "after": set()})[side].add(row.id)
        points = values.setdefault(key, {"before": defaultdict(list), "after": defaultdict(list)})
        for metric in SERVING_METRICS:
            value = getattr(row, metric)
            if value is not None and value > 0:
                cell = PointKey(
                    metric, server.get("prompt_tokens", 0), server.get("gen_tokens", 0),
                    row.concurrency,
                )  # fmt: skip
                points[side][cell].append(float(value))
    groups = []
    for key, sides in values.items():
        group = Group(key[0], described[key], key[1], key[2])
        for side in ("before", "after"):
            group.runs[side] = len(runs[key][side])
            group.sides[side] = {cell: _figures(found) for cell, found in sides[side].items()}
        groups.append(group)
    return groups


def _figures(values: Sequence[float]) -> SideFigures:
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) / mean if len(values) > 1 else None
    return SideFigures(runs=len(values), mean=mean, spread=spread, repeat_noise=None)
