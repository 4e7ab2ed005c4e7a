"""The builds a comparison names, and each one's sums as columns: held by this process
(registry.compare.cache), or (for runs since a time) read from the runs themselves; with
the names of the nodes and hardware they mention."""

from __future__ import annotations

import re
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from fleetbench.registry.compare.cache import (
    SumsCache,
    Texts,
    mentioned,
    read_names,
    table_of_rows,
)
from fleetbench.registry.compare.pairs import Labels, SumsTable
from fleetbench.registry.compare.sums import METRICS, metrics_of, sums_of_runs
from fleetbench.registry.labels import binding_label, build_label
from fleetbench.registry.models import BuildPointSum, EngineBuild, Run

__all__ = ["BuildSelection", "Sides", "build_matches", "read_sides", "select_builds"]

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


@dataclass(frozen=True)
class Sides:
    before: SumsTable
    after: SumsTable
    labels: Labels


# one per database: a process may serve several (tests do), whose ids mean other rows
_CACHES: weakref.WeakKeyDictionary[Engine, SumsCache] = weakref.WeakKeyDictionary()
_TEXTS = Texts()  # settings and runner labels as codes, the same in every table


def read_sides(
    connection: Connection,
    *,
    kind: str,
    model_ids: Collection[int],
    builds: BuildSelection,
    since: datetime | None,
) -> Sides:
    """Each side's sums, its several builds' summed, and what their codes stand for."""
    build_ids = [*builds.before_ids, *builds.after_ids]
    if since is None:
        cache = _CACHES.setdefault(connection.engine, SumsCache())
        held = cache.tables(connection, kind, model_ids, build_ids, _TEXTS)
        tables = {b: SumsTable.joined([h.table for h in found]) for b, found in held.items()}
        everything = [h for found in held.values() for h in found]
        nodes = {i: name for h in everything for i, name in h.nodes.items()}
        # a class filled in later (an old fingerprint summarised) wins over none
        hardware = {
            i: named for h in everything for i, named in h.hardware.items() if not named[1]
        } | {i: named for h in everything for i, named in h.hardware.items() if named[1]}
    else:
        tables = _since(connection, kind, model_ids, build_ids, since)
        names = mentioned(
            BuildPointSum.model_id.in_(list(model_ids)),
            BuildPointSum.build_id.in_(list(build_ids)),
        )
        nodes, hardware = read_names(connection, names, {})
    runner_code = {b: _TEXTS.code(runner) for b, runner in builds.runners.items()}
    # a copy, once every code this question uses is made: other requests add texts meanwhile
    labels = Labels(tuple(_TEXTS.texts()), METRICS, nodes, hardware)
    with_runner = {b: t.with_runner(runner_code[b]) for b, t in tables.items()}
    before = SumsTable.joined([with_runner[b] for b in builds.before_ids if b in with_runner])
    after = SumsTable.joined([with_runner[b] for b in builds.after_ids if b in with_runner])
    return Sides(before, after, labels)


def _since(
    connection: Connection,
    kind: str,
    model_ids: Collection[int],
    build_ids: Collection[int],
    since: datetime,
) -> dict[int, SumsTable]:
    """The sums of the runs started since `since`, per build, from the runs themselves."""
    statement = sums_of_runs(
        kind,
        Run.model_id.in_(list(model_ids)),
        Run.build_id.in_(list(build_ids)),
        Run.started_at >= since,
    )
    # per model and build: one name may stand for several models, whose rows of one key
    # are summed (SumsTable.joined), as the cache's tables are
    found: dict[tuple[int, int], list[Any]] = {}
    for row in connection.execute(statement):
        found.setdefault((row.build_id, row.model_id), []).append(row)
    tables: dict[int, list[SumsTable]] = {}
    for (build_id, _), rows in found.items():
        tables.setdefault(build_id, []).append(table_of_rows(rows, metrics_of(kind), _TEXTS))
    return {b: SumsTable.joined(t) for b, t in tables.items()}
