"""Faster but wrong is not a go: each node's output fingerprints (contract.outputs) of the two
builds compared, and a verdict per hardware class on what the model outputs.

A node is compared on one model file, one kind of run, one runner (engine, backend, binding)
and the settings that change outputs (compare.output_rules.OUTPUT_SETTINGS: the offload,
flash attention, the KV cache's types), its newest fingerprint of each build: the KL
divergence of the new build's outputs from the old one's (mean and p99 over the reference
text's positions) and the share of positions whose top token agrees. A class's **floor** is
the change its backend shows with no new build at all: the largest KL (mean, and p99)
between two runs of the old build on one node, or between two nodes of the class on the old
build and one file (a GPU's reductions need not run in the same order twice); the new
build's own spread is what is judged, never its floor. Its verdict: `unchanged` where every
node's outputs are the same to a millionth of a nat; `changed`, which holds a rollout, where
a node's new outputs have positions whose logits are no numbers (NaN, inf) the old ones did
not, or where the worst node's mean KL is above both twice the floor's and `min_kl`, or its
p99 above both twice the floor's p99 and ten times `min_kl` (a kernel wrong on some kinds of
token only moves a few positions far); else `within the floor` (the bars:
compare.output_rules, which the regression judge's output shifts share)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from sqlalchemy import Connection, and_, func, select

from fleetbench.contract.answers import ClassOutputs, CompareKind
from fleetbench.contract.outputs import OutputDifference, OutputFingerprint, compare_outputs
from fleetbench.registry.compare.output_rules import (
    OUTPUT_SETTINGS,
    Floor,
    beyond_floor,
    floor_of,
    newly_non_finite,
    outputs_runner,
)
from fleetbench.registry.compare.rows import BuildSelection
from fleetbench.registry.hardware import UNKNOWN_CLASS
from fleetbench.registry.models import (
    RUN_SERVED,
    HardwareFingerprint,
    Node,
    Run,
    successful_offline,
)

__all__ = [
    "OutputsVerdict",
    "RunOutputs",
    "describe",
    "judge_outputs",
    "read_outputs",
]

OutputsState = Literal["unchanged", "within the floor", "changed"]
UNCHANGED_KL = 1e-6  # nats: what rounding the stored log-probabilities leaves
KEPT_PER_BUILD = 2  # a node's newest runs of a build read: two give its run-to-run floor


@dataclass(frozen=True)
class RunOutputs:
    """A run's fingerprint, with what it is compared on."""

    node: str
    hardware_class: str
    model_id: int
    runner: str  # outputs_runner: runs of another kind, runner or settings never compare
    after: bool  # of the new build (else of the old one)
    outputs: OutputFingerprint


@dataclass(frozen=True)
class OutputsVerdict:
    """A class's outputs: how far its worst node moved, against its floor."""

    state: OutputsState
    nodes: int
    worst_node: str
    worst: OutputDifference
    floor_kl: float  # the mean KL the class shows without a new build
    floor_p99_kl: float
    reason: str = field(default="")


def read_outputs(
    connection: Connection,
    *,
    kind: CompareKind = "offline",
    model_ids: Sequence[int],
    builds: BuildSelection,
    since: datetime | None = None,
) -> list[RunOutputs]:
    """Each node's newest fingerprints (KEPT_PER_BUILD) of each build of the models, newest
    first, from runs of `kind` that count (successful, not contended; started `since`): a
    serving sweep's are its server's."""
    wanted = sorted(builds.before_ids | builds.after_ids)
    if not model_ids or not wanted:
        return []
    newest = (
        func.row_number()
        .over(
            partition_by=(Run.node_id, Run.model_id, Run.build_id),
            order_by=(Run.started_at.desc(), Run.received_at.desc(), Run.id),
        )
        .label("newest")
    )
    ranked = (
        select(
            Node.name.label("node"),
            func.coalesce(HardwareFingerprint.hardware_class, UNKNOWN_CLASS).label("hardware"),
            Run.model_id,
            Run.build_id,
            *(getattr(Run, name) for name in OUTPUT_SETTINGS),
            Run.started_at,
            Run.outputs,
            newest,
        )
        .join(Node, Node.id == Run.node_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
        .where(
            Run.model_id.in_(list(model_ids)),
            Run.build_id.in_(wanted),
            successful_offline(Run) if kind == "offline" else RUN_SERVED,
            # (a run without one holds JSON's null, as bulk ingest writes None, not NULL)
            Run.outputs["text_version"].as_string().is_not(None),
            *([Run.started_at >= since] if since is not None else []),
        )
        .subquery()
    )
    found = []
    latest = select(ranked).where(and_(ranked.c.newest <= KEPT_PER_BUILD))
    for row in connection.execute(latest.order_by(ranked.c.started_at.desc())):
        found.append(
            RunOutputs(
                node=row.node,
                hardware_class=row.hardware,
                model_id=row.model_id,
                runner=outputs_runner(kind, builds.runners.get(row.build_id, ""), row),
                after=row.build_id in builds.after_ids,
                outputs=OutputFingerprint.model_validate(row.outputs),
            )
        )
    return found


def judge_outputs(runs: Iterable[RunOutputs], *, min_kl: float) -> dict[str, OutputsVerdict]:
    """Each hardware class's verdict on its nodes compared (a node with both builds' outputs
    on one model file and runner); classes with none compared are left out."""
    by_side: dict[tuple[str, str, int, str, bool], list[OutputFingerprint]] = defaultdict(list)
    for run in runs:  # newest first within each side, as read
        key = (run.hardware_class, run.node, run.model_id, run.runner, run.after)
        by_side[key].append(run.outputs)
    moved: dict[str, list[tuple[str, OutputDifference, int]]] = defaultdict(list)
    floors: dict[str, list[OutputDifference]] = defaultdict(list)
    for (hardware, node, model, runner, after), taken in sorted(by_side.items()):
        if after:  # the floor is the old build's: the new one's spread is what is judged
            continue
        floors[hardware] += _differences(taken[:1], taken[1:2])  # run to run
        if new := by_side.get((hardware, node, model, runner, True)):
            difference = compare_outputs(taken[0], new[0])
            if difference is not None:
                moved[hardware].append((node, difference, newly_non_finite(taken[0], new[0])))
    floors_across = _across_nodes(by_side)
    verdicts = {}
    for hardware, compared in moved.items():
        floor = floor_of([*floors[hardware], *floors_across.get(hardware, [])])
        verdicts[hardware] = _verdict(compared, floor, min_kl)
    return verdicts


def _across_nodes(
    by_side: Mapping[tuple[str, str, int, str, bool], list[OutputFingerprint]],
) -> dict[str, list[OutputDifference]]:
    """Per class, the mean KL of each node's newest fingerprint of the old build from the
    first node's, on one model file and runner: the spread the backend shows across
    machines (the new build's own spread is what is judged, never its floor)."""
    first: dict[tuple[str, int, str], OutputFingerprint] = {}
    spread: dict[str, list[OutputDifference]] = defaultdict(list)
    for (hardware, _node, model, runner, after), taken in sorted(by_side.items()):
        if not after:
            reference = first.setdefault((hardware, model, runner), taken[0])
            spread[hardware] += _differences([reference], taken[:1])
    return spread


def _differences(
    base: Sequence[OutputFingerprint], other: Sequence[OutputFingerprint]
) -> list[OutputDifference]:
    found = [compare_outputs(b, o) for b, o in zip(base, other, strict=False)]
    return [d for d in found if d is not None]


def _verdict(
    compared: Sequence[tuple[str, OutputDifference, int]],
    floor: Floor,
    min_kl: float,
) -> OutputsVerdict:
    worst_node, worst, _ = max(compared, key=lambda c: (c[1].mean_kl, -c[1].top_token_agreement))
    broken = [(node, count) for node, _, count in compared if count > 0]
    nodes = len({node for node, _, _ in compared})
    of_nodes = f"{nodes} node{'s' if nodes != 1 else ''}"
    figures = (
        f"{worst} on {worst_node}, the worst of {of_nodes} (the class's floor: KL mean "
        f"{floor.mean_kl:.4f}, p99 {floor.p99_kl:.4f})"
    )
    state: OutputsState
    if broken:
        node, count = max(broken, key=lambda b: b[1])
        state = "changed"
        reason = f"outputs changed: {count} positions' logits are no numbers (NaN, inf) on {node}"
    elif worst.mean_kl <= UNCHANGED_KL and worst.top_token_agreement == 1.0:
        state, reason = "unchanged", f"outputs unchanged over {of_nodes}"
    elif beyond_floor(worst, floor, min_kl):
        state, reason = "changed", f"outputs changed: {figures}"
    else:
        state, reason = "within the floor", f"outputs changed within the floor: {figures}"
    return OutputsVerdict(state, nodes, worst_node, worst, floor.mean_kl, floor.p99_kl, reason)


def describe(verdict: OutputsVerdict) -> ClassOutputs:
    """The verdict as the answer states it."""
    return ClassOutputs(
        state=verdict.state,
        nodes=verdict.nodes,
        worst_node=verdict.worst_node,
        mean_kl=verdict.worst.mean_kl,
        p99_kl=verdict.worst.p99_kl,
        top_token_agreement=verdict.worst.top_token_agreement,
        floor_kl=verdict.floor_kl,
        floor_p99_kl=verdict.floor_p99_kl,
        reason=verdict.reason,
    )
