"""The builds a comparison names, and each one's sums as columns: as kept at ingest (one
range of build_point_sums' key per build, registry.projections.build_sums), or (for runs
since a time) summed from the runs themselves; with the names of the nodes and hardware
they mention, and the signature that moves whenever those sums do."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Connection, Select, bindparam, func, select
from sqlalchemy.orm import Session

from fleetbench.registry.compare.pairs import Labels, SumsTable
from fleetbench.registry.models import (
    BuildPointSum,
    BuildSumsStamp,
    EngineBuild,
    HardwareFingerprint,
    Node,
    Run,
)
from fleetbench.registry.projections.build_sums import (
    METRICS,
    SUM_COLUMNS,
    metrics_of,
    sums_of_runs,
)
from fleetbench.registry.regressions.labels import binding_label, build_label, runner_label

__all__ = [
    "BuildSelection",
    "Sides",
    "build_matches",
    "read_sides",
    "select_builds",
    "sums_signature",
    "table_of_rows",
]

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
        {i: runner_label(b) for i, b in (first | second).items()},
    )


@dataclass(frozen=True)
class Sides:
    before: SumsTable
    after: SumsTable
    labels: Labels


class Texts:
    """One question's labels (settings, runners) as codes, the same code for the same text
    in each of its tables."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def code(self, text: str) -> int:
        return self._codes.setdefault(text, len(self._codes))

    def texts(self) -> tuple[str, ...]:
        return tuple(self._codes)


_COLUMNS = ("node_id", "fingerprint_id", "settings", "metric", "pp", "tg", "b", *SUM_COLUMNS)
# one build's sums: one range of the table's key (model, build, node, ...)
_OF_BUILDS = (
    BuildPointSum.model_id.in_(bindparam("model_ids", expanding=True)),
    BuildPointSum.build_id.in_(bindparam("build_ids", expanding=True)),
    BuildPointSum.metric.in_(bindparam("metrics", expanding=True)),
)
_SUMS = select(
    BuildPointSum.model_id,
    BuildPointSum.build_id,
    *(getattr(BuildPointSum, column) for column in _COLUMNS),
).where(*_OF_BUILDS)


def read_sides(
    connection: Connection,
    *,
    kind: str,
    model_ids: Collection[int],
    builds: BuildSelection,
    since: datetime | None,
) -> Sides:
    """Each side's sums, its several builds' summed, and what their codes stand for: kept
    at ingest (build_point_sums), or those of the runs started `since` a time."""
    build_ids = [*builds.before_ids, *builds.after_ids]
    asked = {
        "model_ids": list(model_ids),
        "build_ids": build_ids,
        "metrics": list(metrics_of(kind)),
    }
    if since is None:
        rows = connection.execute(_SUMS, asked).all()
    else:
        rows = connection.execute(
            sums_of_runs(
                kind,
                Run.model_id.in_(list(model_ids)),
                Run.build_id.in_(build_ids),
                Run.started_at >= since,
            )
        ).all()
    # per model and build: one name may stand for several models, whose rows of one key
    # are summed (SumsTable.joined)
    found: dict[tuple[int, int], list[Any]] = {}
    for row in rows:
        found.setdefault((row.build_id, row.model_id), []).append(row)
    texts = Texts()
    tables: dict[int, list[SumsTable]] = {}
    for (build_id, _), of_build in found.items():
        table = table_of_rows(of_build, metrics_of(kind), texts)
        tables.setdefault(build_id, []).append(
            table.with_runner(texts.code(builds.runners[build_id]))
        )
    nodes, hardware = read_names(connection, mentioned(*_OF_BUILDS), asked)
    labels = Labels(texts.texts(), METRICS, nodes, hardware)
    before = SumsTable.joined([t for b in builds.before_ids for t in tables.get(b, [])])
    after = SumsTable.joined([t for b in builds.after_ids for t in tables.get(b, [])])
    return Sides(before, after, labels)


def table_of_rows(rows: Sequence[Any], metrics: Sequence[str], texts: Texts) -> SumsTable:
    """Rows with build_point_sums' columns as a table (its runner code left 0), made a
    column at a time: 6,000 rows cost milliseconds, not the tenth of a second that one
    object per row does."""
    if not rows:
        return SumsTable.empty()
    columns = dict(zip(rows[0]._fields, zip(*rows, strict=True), strict=True))
    metric_code = {m: METRICS.index(m) for m in metrics}
    keys = np.column_stack(
        [
            np.array(columns["node_id"], np.int64),
            np.array(columns["fingerprint_id"], np.int64),
            np.array([texts.code(t) for t in columns["settings"]], np.int64),
            np.zeros(len(rows), np.int64),
            np.array([metric_code[m] for m in columns["metric"]], np.int64),
            *(np.array(columns[c], np.int64) for c in ("pp", "tg", "b")),
        ]
    )
    sums = np.column_stack([np.array(columns[c], np.float64) for c in SUM_COLUMNS])
    return SumsTable(keys, sums)


Names = tuple[dict[int, str], dict[int, tuple[str | None, str | None]]]
NameStatements = tuple[Select[int, str], Select[int, str | None, str | None]]


def mentioned(*where: ColumnElement[bool]) -> NameStatements:
    """The nodes and the fingerprints that the sums `where` selects mention."""
    nodes = select(Node.id, Node.name).where(
        Node.id.in_(select(BuildPointSum.node_id).where(*where))
    )
    hardware = select(
        HardwareFingerprint.id, HardwareFingerprint.description, HardwareFingerprint.hardware_class
    ).where(HardwareFingerprint.id.in_(select(BuildPointSum.fingerprint_id).where(*where)))
    return nodes, hardware


def read_names(connection: Connection, statements: NameStatements, asked: dict[str, Any]) -> Names:
    """Node id -> name, and fingerprint id -> (description, hardware class)."""
    nodes, hardware = statements
    named = {row.id: row.name for row in connection.execute(nodes, asked)}
    found = connection.execute(hardware, asked)
    return named, {row.id: (row.description, row.hardware_class) for row in found}


_SIGNATURES = (
    select(
        BuildSumsStamp.model_id,
        BuildSumsStamp.build_id,
        func.count(),
        func.sum(BuildSumsStamp.version),
        func.max(BuildSumsStamp.changed_at),
    )
    .where(
        BuildSumsStamp.model_id.in_(bindparam("model_ids", expanding=True)),
        BuildSumsStamp.build_id.in_(bindparam("build_ids", expanding=True)),
    )
    .group_by(BuildSumsStamp.model_id, BuildSumsStamp.build_id)
    .order_by(BuildSumsStamp.model_id, BuildSumsStamp.build_id)
)


def sums_signature(
    connection: Connection, model_ids: Collection[int], build_ids: Collection[int]
) -> tuple[tuple[Any, ...], ...]:
    """What changes whenever any of these builds' sums do: each one's nodes, the sum of
    their stamps' versions and its latest change (every write of a node's sums raises its
    version in the same transaction, registry.projections.build_sums)."""
    asked = {"model_ids": list(model_ids), "build_ids": list(build_ids)}
    return tuple(tuple(row) for row in connection.execute(_SIGNATURES, asked))
