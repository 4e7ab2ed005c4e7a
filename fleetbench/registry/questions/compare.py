"""Is a new llama.cpp build safe to roll out? Two builds compared node by node, and a
verdict for the fleet per hardware class.

A node is compared where it ran both builds on the same hardware (drivers included) with
the same settings: at each point (PP, TG, B; serving: the concurrency) the ratio of the new
build's mean to the old one's, for each metric. Its uncertainty comes from the runs
themselves: the relative spread between runs of each build (pooled), never below the spread
the points' own repeats report nor the detector's noise floor. A change is *beyond
detection* when it is at least the change the regression check would find with 95%
probability with these runs (questions.regressions.detectable_change): a change that small
is told from noise.

A hardware class (one GPU or CPU model, whatever the driver) takes the median of its nodes'
ratios at each point. Its verdict: `hold` where its median is worse, beyond what its nodes'
runs can tell from noise, by at least `min_change`; `unknown` where its runs cannot see a
slowdown of `max_detectable` (too few runs, or too noisy: it says how many more runs of
each build each node needs); else `go`. The fleet holds if any class holds, is unknown if
any compared class is, and goes otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from fleetbench.registry.questions.hardware import hardware_class
from fleetbench.registry.questions.regressions import DETECTION_POWER_Z, DetectionSettings

__all__ = [
    "LOWER_IS_BETTER",
    "CellComparison",
    "ClassCell",
    "ClassVerdict",
    "CompareSettings",
    "FleetVerdict",
    "NodeComparison",
    "PointKey",
    "SideFigures",
    "Verdict",
    "compare_cell",
    "compare_node",
    "fleet_verdict",
    "runs_needed",
]

Verdict = Literal["go", "hold", "unknown"]
# Metrics where a larger value is worse (a longer wait); the others are speeds.
LOWER_IS_BETTER = frozenset({"ttft_ms_p90"})
# A class's median over this many nodes or more has a median's standard error, sqrt(pi/2)
# times the mean's; below it the median is the mean (of one or two).
_MEDIAN_SE = math.sqrt(math.pi / 2)
_CI_Z = 1.96  # a two-sided 95% interval
# The run-to-run spread assumed where a node's is not known yet (one run of a build): what
# this project's machines showed (README, "Regressions"), to say how many runs to ask for.
ASSUMED_NOISE = 0.03
MOST_RUNS_ASKED = 50


@dataclass(frozen=True)
class CompareSettings:
    min_change: float = 0.05  # a smaller worsening never holds a rollout
    max_detectable: float = 0.10  # a class that cannot see a slowdown this large is unknown
    min_runs: int = 2  # runs of each build a node needs before its point counts
    detection: DetectionSettings = field(default_factory=DetectionSettings)

    @property
    def z(self) -> float:
        """Standard errors a change must clear to be found with 95% probability."""
        return self.detection.z_known + DETECTION_POWER_Z


class PointKey(NamedTuple):  # tuples: a fleet's comparison hashes hundreds of thousands
    metric: str
    pp: int
    tg: int
    b: int  # serving: the concurrency


class SideFigures(NamedTuple):
    """One build's runs at one point of one node."""

    runs: int
    mean: float
    spread: float | None  # relative standard deviation between runs (None: one run)
    repeat_noise: float | None  # relative standard error from the points' own repeats


class CellComparison(NamedTuple):
    key: PointKey
    before: SideFigures
    after: SideFigures
    ratio: float  # after / before
    low: float  # 95% interval of the ratio
    high: float
    noise: float  # relative run-to-run spread used
    detectable: float  # the smallest change these runs tell from noise (95%)
    worse: float  # how much worse the new build is (negative: better), a fraction

    @property
    def beyond_detection(self) -> bool:
        return abs(self.ratio - 1) >= self.detectable

    @property
    def log_se(self) -> float:
        return self.noise * math.sqrt(1 / self.before.runs + 1 / self.after.runs)


@dataclass(frozen=True)
class NodeComparison:
    node: str
    hardware_class: str | None
    cells: tuple[CellComparison, ...] = ()
    reason: str | None = None  # why it was not compared
    runs_before: int = 0
    runs_after: int = 0

    @property
    def compared(self) -> bool:
        return bool(self.cells)


@dataclass(frozen=True)
class ClassCell:
    key: PointKey
    nodes: int
    ratio: float  # the median of the nodes' ratios
    worst_node: str
    worst_ratio: float
    detectable: float  # the smallest slowdown these runs find with 95% probability
    significant: float  # the smallest change told from noise (z_known standard errors)
    worse: float

    def held(self, s: CompareSettings) -> bool:
        """Worse by at least the minimum change, and beyond noise: `significance` standard
        errors (the regression check's at a known change). `detectable` adds the power
        margin: what these runs could miss, which decides `unknown`, not `hold`."""
        return self.worse >= max(self.significant, s.min_change)


@dataclass(frozen=True)
class ClassVerdict:
    hardware_class: str
    verdict: Verdict
    reason: str
    nodes_compared: int
    nodes_not_compared: int
    cells: tuple[ClassCell, ...]
    runs_needed: int | None  # more runs of each build on each node (unknown only)


@dataclass(frozen=True)
class FleetVerdict:
    verdict: Verdict
    reason: str
    classes: tuple[ClassVerdict, ...]


def _worse(metric: str, ratio: float) -> float:
    return ratio - 1 if metric in LOWER_IS_BETTER else 1 - ratio


def compare_cell(
    key: PointKey, before: SideFigures, after: SideFigures, s: CompareSettings
) -> CellComparison | None:
    """One point of one node, both builds measured there (None: a mean not positive)."""
    if before.mean <= 0 or after.mean <= 0:
        return None
    spreads = [(side.runs - 1, side.spread) for side in (before, after) if side.spread is not None]
    degrees = sum(d for d, _ in spreads)
    pooled = math.sqrt(sum(d * x * x for d, x in spreads) / degrees) if degrees else 0.0
    repeats = [x for x in (before.repeat_noise, after.repeat_noise) if x is not None]
    noise = max(pooled, max(repeats, default=0.0), s.detection.noise_floor)
    ratio = after.mean / before.mean
    if not (math.isfinite(ratio) and ratio > 0):  # figures too far apart to divide
        return None
    se = noise * math.sqrt(1 / before.runs + 1 / after.runs)
    # a spread so wide its interval is no number: as wide as a float allows
    spread = math.exp(min(_CI_Z * se, 300.0))
    return CellComparison(
        key=key,
        before=before,
        after=after,
        ratio=ratio,
        low=ratio / spread,
        high=ratio * spread,
        noise=noise,
        detectable=max(s.min_change, s.z * se),
        worse=_worse(key.metric, ratio),
    )


def compare_node(
    node: str,
    hardware: str | None,
    before: Mapping[PointKey, SideFigures],
    after: Mapping[PointKey, SideFigures],
    s: CompareSettings,
) -> NodeComparison:
    """A node's points measured with both builds (its runs on one hardware and settings)."""
    cells = [
        cell
        for key in sorted(before.keys() & after.keys(), key=_point_order)
        if (cell := compare_cell(key, before[key], after[key], s)) is not None
    ]
    runs_before = max((f.runs for f in before.values()), default=0)
    runs_after = max((f.runs for f in after.values()), default=0)
    reason = None if cells else "the two builds measured no point in common"
    return NodeComparison(
        node, hardware_class(hardware), tuple(cells), reason, runs_before, runs_after
    )


def _point_order(key: PointKey) -> tuple[str, int, int, int]:
    return (key.metric, key.pp, key.tg, key.b)


def _class_cells(nodes: Sequence[NodeComparison], s: CompareSettings) -> list[ClassCell]:
    by_key: dict[PointKey, list[tuple[str, CellComparison]]] = defaultdict(list)
    for node in nodes:
        for cell in node.cells:
            if min(cell.before.runs, cell.after.runs) >= s.min_runs:
                by_key[cell.key].append((node.node, cell))
    cells = []
    for key in sorted(by_key, key=_point_order):
        found = by_key[key]
        ratios = [c.ratio for _, c in found]
        k = len(found)
        factor = _MEDIAN_SE if k >= 3 else 1.0
        se = factor * math.sqrt(sum(c.log_se**2 for _, c in found)) / k
        worst_node, worst = max(found, key=lambda nc: nc[1].worse)
        median = math.exp(statistics.median(math.log(r) for r in ratios))
        cells.append(
            ClassCell(
                key=key,
                nodes=k,
                ratio=median,
                worst_node=worst_node,
                worst_ratio=worst.ratio,
                detectable=max(s.min_change, s.z * se),
                significant=s.detection.z_known * se,
                worse=_worse(key.metric, median),
            )
        )
    return cells


def runs_needed(noise: float, nodes: int, s: CompareSettings) -> int:
    """Runs of each build on each of `nodes` nodes for their class to see a slowdown of
    `max_detectable` (at most MOST_RUNS_ASKED: a noisier class needs quieter runs)."""
    factor = _MEDIAN_SE if nodes >= 3 else 1.0
    for n in range(s.min_runs, MOST_RUNS_ASKED + 1):
        se = factor * noise * math.sqrt(2 / n) / math.sqrt(max(nodes, 1))
        if max(s.min_change, s.z * se) <= s.max_detectable:
            return n
    return MOST_RUNS_ASKED


def _describe(cell: ClassCell, metric_names: Mapping[str, str]) -> str:
    name = metric_names.get(cell.key.metric, cell.key.metric)
    at = f"B={cell.key.b} (PP {cell.key.pp}, TG {cell.key.tg})"
    how = "longer" if cell.key.metric in LOWER_IS_BETTER else "slower"
    worst = abs(_worse(cell.key.metric, cell.worst_ratio))
    return (
        f"{name} at {at} {cell.worse:.1%} {how} (median of {cell.nodes} node"
        f"{'s' if cell.nodes != 1 else ''}; worst {cell.worst_node} {worst:.1%}), "
        f"beyond the {cell.detectable:.1%} its runs tell from noise"
    )


def class_verdict(
    name: str,
    nodes: Sequence[NodeComparison],
    s: CompareSettings,
    metric_names: Mapping[str, str],
) -> ClassVerdict:
    compared = [n for n in nodes if n.compared]
    cells = _class_cells(compared, s)
    not_compared = len(nodes) - len(compared)
    held = [c for c in cells if c.held(s)]
    if held:
        worst = max(held, key=lambda c: c.worse)
        also = f" (and {len(held) - 1} more point{'s' if len(held) > 2 else ''})"
        reason = _describe(worst, metric_names) + (also if len(held) > 1 else "")
        return ClassVerdict(name, "hold", reason, len(compared), not_compared, tuple(cells), None)
    blind = max((c.detectable for c in cells), default=None)
    short = [n for n in compared if min(n.runs_before, n.runs_after) < s.min_runs]
    if blind is None or blind > s.max_detectable or short:
        needed = runs_needed(_noisiest(compared), len(compared), s)
        have = min((min(n.runs_before, n.runs_after) for n in compared), default=0)
        more = max(needed - have, 1)
        if not compared:
            why = "no node ran both builds on the same hardware and settings"
        elif blind is None or short:
            names = ", ".join(n.node for n in short[:5]) + (", ..." if len(short) > 5 else "")
            why = f"fewer than {s.min_runs} runs of each build on {names}"
        else:
            why = f"its runs tell only changes of {blind:.1%} or more from noise"
        reason = (
            f"{why}: {more} more run{'s' if more != 1 else ''} of each build on each node "
            f"({needed} in all) would show a {s.max_detectable:.0%} slowdown"
        )
        return ClassVerdict(
            name, "unknown", reason, len(compared), not_compared, tuple(cells), more
        )
    reason = (
        f"no point slower beyond what its runs tell from noise (at most {blind:.1%}) over "
        f"{len(compared)} node{'s' if len(compared) != 1 else ''}"
    )
    return ClassVerdict(name, "go", reason, len(compared), not_compared, tuple(cells), None)


def _noisiest(nodes: Sequence[NodeComparison]) -> float:
    """The run-to-run spread to plan runs by: the noisiest point's where runs tell it, else
    ASSUMED_NOISE (one run of a build has no spread, only the floor)."""
    told = [c.noise for n in nodes for c in n.cells if c.before.runs > 1 or c.after.runs > 1]
    return max(told, default=ASSUMED_NOISE)


def fleet_verdict(
    nodes: Iterable[NodeComparison], s: CompareSettings, metric_names: Mapping[str, str]
) -> FleetVerdict:
    """The verdict per hardware class of the nodes that ran the new build, and the fleet's."""
    by_class: dict[str, list[NodeComparison]] = defaultdict(list)
    for node in nodes:
        by_class[node.hardware_class or "unknown hardware"].append(node)
    classes = tuple(class_verdict(k, v, s, metric_names) for k, v in sorted(by_class.items()))
    held = [c for c in classes if c.verdict == "hold"]
    unknown = [c for c in classes if c.verdict == "unknown"]
    if held:
        reason = "; ".join(f"{c.hardware_class}: {c.reason}" for c in held)
        return FleetVerdict("hold", reason, classes)
    if not classes:
        return FleetVerdict("unknown", "no node ran the new build", classes)
    if unknown:
        reason = "; ".join(f"{c.hardware_class}: {c.reason}" for c in unknown)
        return FleetVerdict("unknown", reason, classes)
    names = ", ".join(c.hardware_class for c in classes)
    return FleetVerdict("go", f"no hardware class slower ({names})", classes)
