"""Each build's sums (table build_point_sums) held as columns by this registry process, so
that a comparison reads its two builds from memory rather than 24,000 rows.

Fetching a 1,000-node build's 12,000 rows costs a small registry 30 to 60 ms, most of a
comparison's budget; the sums change only when runs of that build arrive or are pruned.
So each question first reads each build's signature from build_sums_stamps (a row per
node: how many nodes, the sum of their versions, the latest change) and fetches again
only a build whose signature moved. Every write of a node's sums raises its version in
the same transaction (registry.compare.sums); only deleting a node takes a row away, and
a later write is later. Several registry processes each hold their own; none misses
another's change.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Connection, Select, bindparam, func, select

from fleetbench.registry.compare.pairs import SumsTable
from fleetbench.registry.compare.sums import METRICS, SUM_COLUMNS, metrics_of
from fleetbench.registry.models import BuildPointSum, BuildSumsStamp, HardwareFingerprint, Node

__all__ = ["HeldBuild", "Names", "SumsCache", "Texts", "mentioned", "read_names", "table_of_rows"]

MOST_BUILDS_HELD = 64  # (model, build, kind) tables: 1,000 nodes' build is about 1 MB


class Texts:
    """Labels as codes, the same code for the same text in every table of this process."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._texts: list[str] = []
        self._lock = threading.Lock()

    def code(self, text: str) -> int:
        found = self._codes.get(text)
        if found is None:
            with self._lock:
                found = self._codes.get(text)
                if found is None:
                    found = len(self._texts)
                    self._texts.append(text)  # before the code is seen: its text is there
                    self._codes[text] = found
        return found

    def texts(self) -> Sequence[str]:
        return self._texts


def table_of_rows(rows: Sequence[Any], metrics: Sequence[str], texts: Texts) -> SumsTable:
    """Rows with build_point_sums' columns as a table (its runner code left 0), made a
    column at a time: 6,000 rows cost milliseconds, not the tenth of a second that one
    object per row does."""
    if not rows:
        return SumsTable.empty()
    columns = dict(zip(rows[0]._fields, zip(*rows, strict=True), strict=True))
    settings = {text: texts.code(text) for text in set(columns["settings"])}
    metric_code = {m: METRICS.index(m) for m in metrics}
    keys = np.column_stack(
        [
            np.array(columns["node_id"], np.int64),
            np.array(columns["fingerprint_id"], np.int64),
            np.array([settings[t] for t in columns["settings"]], np.int64),
            np.zeros(len(rows), np.int64),
            np.array([metric_code[m] for m in columns["metric"]], np.int64),
            *(np.array(columns[c], np.int64) for c in ("pp", "tg", "b")),
        ]
    )
    sums = np.column_stack([np.array(columns[c], np.float64) for c in SUM_COLUMNS])
    return SumsTable(keys, sums)


_ONE_BUILD = (
    BuildPointSum.model_id == bindparam("model_id"),
    BuildPointSum.build_id == bindparam("build_id"),
    BuildPointSum.metric.in_(bindparam("metrics", expanding=True)),
)
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
)
_ROWS = select(
    *(
        getattr(BuildPointSum, c)
        for c in ("node_id", "fingerprint_id", "settings", "metric", "pp", "tg", "b", *SUM_COLUMNS)
    ),
).where(
    *_ONE_BUILD,
)


_VERSIONS = select(BuildSumsStamp.node_id, BuildSumsStamp.version).where(
    BuildSumsStamp.model_id == bindparam("model_id"),
    BuildSumsStamp.build_id == bindparam("build_id"),
)
_OF_NODES = BuildPointSum.node_id.in_(bindparam("node_ids", expanding=True))
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


_NAMES = mentioned(*_ONE_BUILD)
_NAMES_OF_NODES = mentioned(*_ONE_BUILD, _OF_NODES)


@dataclass(frozen=True)
class HeldBuild:
    """A build's sums, and the names of the nodes and hardware they mention (which change
    with the rows: a node's name never does, and a deleted one takes its rows along)."""

    signature: tuple[int, int, datetime]
    versions: dict[int, int]  # node id -> its stamp's version, as read
    table: SumsTable
    nodes: dict[int, str]
    hardware: dict[int, tuple[str | None, str | None]]  # description, class


class SumsCache:
    """The latest tables read, the least recently asked dropped first."""

    def __init__(self, size: int = MOST_BUILDS_HELD) -> None:
        self._held: OrderedDict[tuple[int, int, str], HeldBuild] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def tables(
        self,
        connection: Connection,
        kind: str,
        model_ids: Collection[int],
        build_ids: Collection[int],
        texts: Texts,
    ) -> dict[int, list[HeldBuild]]:
        """Each build's tables (one per model), as stored now."""
        metrics = list(metrics_of(kind))
        signatures = connection.execute(
            _SIGNATURES,
            {"model_ids": list(model_ids), "build_ids": list(build_ids)},
        ).all()
        per_build: dict[int, list[HeldBuild]] = {}
        for model_id, build_id, nodes, versions, changed_at in signatures:
            key = (model_id, build_id, kind)
            signature = (int(nodes), int(versions), changed_at)
            with self._lock:
                held = self._held.get(key)
                if held is not None:
                    self._held.move_to_end(key)
            if held is None or held.signature != signature:
                held = _read(connection, model_id, build_id, metrics, signature, held, texts)
                with self._lock:
                    self._held[key] = held
                    while len(self._held) > self._size:
                        self._held.popitem(last=False)
            per_build.setdefault(build_id, []).append(held)
        return per_build


def _read(
    connection: Connection,
    model_id: int,
    build_id: int,
    metrics: list[str],
    signature: tuple[int, int, datetime],
    held: HeldBuild | None,
    texts: Texts,
) -> HeldBuild:
    """The build's sums as stored now: only the nodes whose stamps moved since `held` was
    read (a canary's new run: its dozen rows), or all of them."""
    asked: dict[str, Any] = {"model_id": model_id, "build_id": build_id, "metrics": metrics}
    versions = {row.node_id: row.version for row in connection.execute(_VERSIONS, asked)}
    changed = None
    if held is not None:
        changed = [
            n
            for n in held.versions.keys() | versions.keys()
            if held.versions.get(n) != versions.get(n)
        ]
        if not changed:  # (its versions were read after a write its signature missed)
            return dataclasses.replace(held, signature=signature)
        if len(changed) > len(versions) // 2:
            changed = None  # most of them: one read of all is cheaper
    if changed is None or held is None:
        rows = connection.execute(_ROWS, asked).all()
        nodes, hardware = read_names(connection, _NAMES, asked)
        return HeldBuild(signature, versions, table_of_rows(rows, metrics, texts), nodes, hardware)
    asked["node_ids"] = changed
    rows = connection.execute(_ROWS.where(_OF_NODES), asked).all()
    kept = ~np.isin(held.table.keys[:, 0], changed)
    fresh = table_of_rows(rows, metrics, texts)
    table = SumsTable(
        np.concatenate([held.table.keys[kept], fresh.keys]),
        np.concatenate([held.table.sums[kept], fresh.sums]),
    )
    nodes, hardware = read_names(connection, _NAMES_OF_NODES, asked)
    return HeldBuild(signature, versions, table, held.nodes | nodes, held.hardware | hardware)
