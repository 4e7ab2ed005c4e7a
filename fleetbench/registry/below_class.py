"""Nodes far below their hardware class: a node whose single-stream decode reaches much less
of its memory bandwidth than its class's other nodes on the same model (a power cap, a
wrong build, a thermal limit, a neighbour). Read from the latest curves (each node's
latest successful run of each model), judged by a pure rule over those rows."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetbench.registry.models import HardwareFingerprint, LatestPoint, LatestRun, Model, Run
from fleetbench.registry.projections.latest import OF_ITS_RUN

__all__ = ["BELOW_SHARE", "FEWEST_NODES", "BelowClass", "ClassRow", "below_class", "nodes_below"]

BELOW_SHARE = 0.7  # of the class's median MBU at B = 1
FEWEST_NODES = 3  # nodes of a class and model before its median says anything


@dataclass(frozen=True)
class ClassRow:
    """A node's best MBU at B = 1 on one model, and its hardware class."""

    node_id: int
    hardware_class: str
    model: str
    mbu: float


@dataclass(frozen=True)
class BelowClass:
    """Why a node is below its class: the model, its MBU at B = 1 and the class's median."""

    hardware_class: str
    model: str
    mbu: float
    class_median: float
    class_nodes: int


def below_class(
    rows: Iterable[ClassRow], *, share: float = BELOW_SHARE, fewest: int = FEWEST_NODES
) -> dict[int, BelowClass]:
    """The nodes whose MBU at B = 1 on a model is under `share` of the median of their
    class's nodes on it (classes of at least `fewest` nodes); for a node below on several
    models, the one it is furthest below on."""
    groups: dict[tuple[str, str], list[ClassRow]] = defaultdict(list)
    for row in rows:
        groups[(row.hardware_class, row.model)].append(row)
    below: dict[int, BelowClass] = {}
    for (hardware_class, model), members in sorted(groups.items()):
        if len(members) < fewest:
            continue
        median = statistics.median(row.mbu for row in members)
        for row in members:
            if median <= 0 or row.mbu >= share * median:
                continue
            found = BelowClass(hardware_class, model, row.mbu, median, len(members))
            known = below.get(row.node_id)
            if known is None or found.mbu / median < known.mbu / known.class_median:
                below[row.node_id] = found
    return below


def _class_rows(session: Session) -> Sequence[ClassRow]:
    """Each node's best MBU at B = 1 per model, with its latest run's hardware class."""
    statement = (
        select(
            LatestRun.node_id,
            HardwareFingerprint.hardware_class,
            func.min(Model.name),
            func.max(LatestPoint.mbu),
        )
        .select_from(LatestPoint)
        .join(LatestRun, OF_ITS_RUN)
        .join(Run, Run.id == LatestRun.run_id)
        .join(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .join(Model, Model.id == LatestRun.model_id)
        .where(
            LatestPoint.b == 1,
            LatestPoint.mbu.is_not(None),
            HardwareFingerprint.hardware_class.is_not(None),
        )
        .group_by(LatestRun.node_id, HardwareFingerprint.hardware_class, Model.name_key)
    )
    return [
        ClassRow(node_id, hardware_class, model, mbu)
        for node_id, hardware_class, model, mbu in session.execute(statement)
        if hardware_class is not None and mbu is not None  # (the query's own conditions)
    ]


def nodes_below(session: Session) -> dict[int, BelowClass]:
    """`below_class` of the fleet's latest curves, by node id."""
    return below_class(_class_rows(session))
