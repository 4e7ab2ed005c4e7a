"""The build comparison's answer: the rows (registry.compare.rows) grouped per node, each node
compared and the fleet judged per hardware class by the pure functions of
registry.compare.rules, and the whole put in the shape `GET /v1/compare` declares."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from fleetbench.contract.answers import (
    COMPARE_METRIC_NAMES,
    ClassPoint,
    ClassSummary,
    CompareAnswer,
    CompareKind,
    NodeCompared,
    NotCompared,
    PointRatio,
)
from fleetbench.registry.compare.outputs import (
    OutputsVerdict,
    describe,
    judge_outputs,
    read_outputs,
)
from fleetbench.registry.compare.pairs import ComparedRows, compare_sums
from fleetbench.registry.compare.rows import (
    BuildSelection,
    read_sides,
    select_builds,
    sums_signature,
)
from fleetbench.registry.compare.rules import (
    CellComparison,
    ClassCell,
    ClassVerdict,
    CompareSettings,
    NodeSummary,
    compare_cell,
    fleet_verdict,
    point_order,
)
from fleetbench.registry.models import Model
from fleetbench.registry.state import Bounded

# The answer's models are the contract's (fleetbench.contract.answers): the agent parses them.
__all__ = ["CompareAnswer", "CompareKind", "compare_builds"]


def compare_builds(
    session: Session,
    models: Sequence[Model],
    *,
    from_build: str,
    to_build: str,
    kind: CompareKind,
    max_age_days: float | None,
    settings: CompareSettings,
    limit: int = 100,
    answers: Bounded[Hashable, CompareAnswer] | None = None,
) -> CompareAnswer:
    """The comparison; from `answers` (the process's, registry.state) while the sums it
    read are unchanged: a rollout gate and the dashboard ask the same question again and
    again, and its answer moves only when runs of either build arrive or are pruned."""
    builds = select_builds(session, from_build, to_build)

    def compared() -> CompareAnswer:
        return _compare(
            session,
            models,
            builds,
            from_build=from_build,
            to_build=to_build,
            kind=kind,
            max_age_days=max_age_days,
            settings=settings,
            limit=limit,
        )

    if answers is None or max_age_days is not None:  # (recent runs: the clock moves it)
        return compared()
    model_ids = sorted(m.id for m in models)
    key = (
        tuple(model_ids),
        builds.before_ids,  # (its labels follow from its builds)
        builds.after_ids,
        builds.both_labels,
        from_build,
        to_build,
        kind,
        settings,
        limit,
        sums_signature(session.connection(), model_ids, [*builds.before_ids, *builds.after_ids]),
    )
    answer = answers.get(key)
    if answer is None:
        answer = compared()
        answers.put(key, answer)
    return answer


def _compare(
    session: Session,
    models: Sequence[Model],
    builds: BuildSelection,
    *,
    from_build: str,
    to_build: str,
    kind: CompareKind,
    max_age_days: float | None,
    settings: CompareSettings,
    limit: int,
) -> CompareAnswer:
    since = datetime.now(UTC) - timedelta(days=max_age_days) if max_age_days else None
    found = ComparedRows([], [], [])
    outputs: dict[str, OutputsVerdict] = {}
    if builds.before_ids and builds.after_ids:
        sides = read_sides(
            session.connection(),
            kind=kind,
            model_ids=[m.id for m in models],
            builds=builds,
            since=since,
        )
        found = compare_sums(
            sides.before,
            sides.after,
            sides.labels,
            noise_floor=settings.detection.noise_floor,
            min_runs=settings.min_runs,
            # Listed worst first, and only the first `limit`: a 1,000-node fleet's every
            # point is 12,000 of them (the verdict weighs them all either way).
            limit=limit,
        )
        taken = read_outputs(
            session.connection(),
            kind=kind,
            model_ids=[m.id for m in models],
            builds=builds,
            since=since,
        )
        outputs = judge_outputs(taken, min_kl=settings.outputs_min_kl)
    fleet = fleet_verdict(found.nodes, found.classes, settings, COMPARE_METRIC_NAMES, outputs)
    reason = fleet.reason
    if not builds.before_ids or not builds.after_ids:
        missing = [
            b
            for b, ids in ((from_build, builds.before_ids), (to_build, builds.after_ids))
            if not ids
        ]
        reason = "no run of build " + " nor of ".join(repr(b) for b in missing) + " is stored"
        if builds.both_labels:
            named = ", ".join(builds.both_labels)
            reason += f" apart from {named}, which {from_build!r} and {to_build!r} both name"
    return CompareAnswer(
        model=models[0].name,
        kind=kind,
        from_build=from_build,
        to_build=to_build,
        from_builds=list(builds.before_labels),
        to_builds=list(builds.after_labels),
        verdict=fleet.verdict,
        reason=reason,
        min_change_pct=settings.min_change * 100,
        max_detectable_pct=settings.max_detectable * 100,
        classes=[_class_summary(c, settings) for c in fleet.classes],
        nodes_compared=sum(1 for n in found.nodes if n.compared),
        nodes=_listed(found, settings),
        not_compared=sorted(
            (
                NotCompared(node=n.node, hardware_class=n.hardware_class, reason=why)
                for n in found.nodes
                if (why := _why_not(n, builds)) is not None
            ),
            key=lambda n: (n.reason == _OLD_ONLY, n.node),  # those with the new build first
        ),
    )


_OLD_ONLY = "it has not run the new build"


def _why_not(node: NodeSummary, builds: BuildSelection) -> str | None:
    """Why a node was not compared (None: it was)."""
    if node.compared:
        return None
    if not node.any_runs_after:
        return _OLD_ONLY
    if node.settings is not None:
        return "the two builds measured no point in common"
    if node.any_runs_before:
        return "its runs of the two builds differ in hardware or settings"
    return f"no run of {', '.join(builds.before_labels)} on it"


def _listed(found: ComparedRows, settings: CompareSettings) -> list[NodeCompared]:
    """The nodes listed, the one most worse at any point first, each point in order."""
    cells: dict[str, list[CellComparison]] = defaultdict(list)
    for listed in found.listed:
        cells[listed.node].append(compare_cell(listed, settings))
    summaries = {n.node: n for n in found.nodes if n.node in cells}
    nodes = []
    for node, compared in sorted(
        cells.items(), key=lambda nc: (-max(c.worse for c in nc[1]), nc[0])
    ):
        summary = summaries[node]
        nodes.append(
            NodeCompared(
                node=node,
                hardware=summary.hardware,
                hardware_class=summary.hardware_class,
                settings=summary.settings or "",
                runs_from=summary.runs_before,
                runs_to=summary.runs_after,
                points=[_point(c) for c in sorted(compared, key=lambda c: point_order(c.key))],
            )
        )
    return nodes


def _point(cell: CellComparison) -> PointRatio:
    return PointRatio(
        metric=cell.key.metric,
        pp=cell.key.pp,
        tg=cell.key.tg,
        b=cell.key.b,
        from_value=cell.before.mean,
        to_value=cell.after.mean,
        ratio=cell.ratio,
        ratio_low=cell.low,
        ratio_high=cell.high,
        runs_from=cell.before.runs,
        runs_to=cell.after.runs,
        detectable_pct=cell.detectable * 100,
        beyond_detection=cell.beyond_detection,
        worse_pct=cell.worse * 100,
    )


def _class_point(cell: ClassCell, settings: CompareSettings) -> ClassPoint:
    return ClassPoint(
        metric=cell.key.metric,
        pp=cell.key.pp,
        tg=cell.key.tg,
        b=cell.key.b,
        nodes=cell.nodes,
        median_ratio=cell.ratio,
        worst_node=cell.worst_node,
        worst_ratio=cell.worst_ratio,
        detectable_pct=cell.detectable * 100,
        worse_pct=cell.worse * 100,
        held=cell.held(settings),
    )


def _class_summary(verdict: ClassVerdict, settings: CompareSettings) -> ClassSummary:
    return ClassSummary(
        hardware_class=verdict.hardware_class,
        verdict=verdict.verdict,
        reason=verdict.reason,
        nodes_compared=verdict.nodes_compared,
        nodes_not_compared=verdict.nodes_not_compared,
        runs_needed=verdict.runs_needed,
        efficiency=verdict.efficiency,
        outputs=describe(verdict.outputs) if verdict.outputs else None,
        points=[_class_point(c, settings) for c in verdict.cells],
    )
