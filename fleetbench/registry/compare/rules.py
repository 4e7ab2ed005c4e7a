"""Is a new llama.cpp build safe to roll out? Two builds compared node by node, and a
verdict for the fleet per hardware class.

A node is compared where it ran both builds on the same hardware (drivers included) with
the same settings: at each point (PP, TG, B; serving: the concurrency) the ratio of the new
build's mean to the old one's, for each metric. Its uncertainty comes from the runs
themselves: the relative spread between runs of each build (pooled), never below the spread
the points' own repeats report nor the detector's noise floor. A change is *beyond
detection* when it is at least the change the regression check would find with 95%
probability with these runs (regressions.rules.detectable_change): a change that small
is told from noise.

A hardware class (one GPU or CPU model, whatever the driver) takes the median of its nodes'
ratios at each point. Its verdict: `hold` where its median is worse, beyond what its nodes'
runs can tell from noise, by at least `min_change`; `unknown` where its runs cannot see a
slowdown of `max_detectable` (too few runs, or too noisy: it says how many more runs of
each build each node needs); else `go`. The fleet holds if any class holds, is unknown if
any compared class is, and goes otherwise.

The arithmetic over a fleet's points (means, spreads, pooled noise, ratios, the class
medians) is registry.compare.pairs', over whole columns; the judgement of its figures is
here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from fleetbench.contract.answers import CompareVerdict

if TYPE_CHECKING:  # (compare.outputs reads rows, whose sums import these rules)
    from fleetbench.registry.compare.outputs import OutputsVerdict
from fleetbench.registry.compare.output_rules import MIN_KL
from fleetbench.registry.hardware import UNKNOWN_CLASS
from fleetbench.registry.regressions.rules import DETECTION_POWER_Z, DetectionSettings

__all__ = [
    "ENERGY_METRICS",
    "LOWER_IS_BETTER",
    "MOST_LOG_RATIO",
    "CellComparison",
    "ClassCell",
    "ClassFigures",
    "ClassVerdict",
    "CompareSettings",
    "FleetVerdict",
    "ListedCell",
    "NodeSummary",
    "PointKey",
    "SideFigures",
    "class_cell",
    "compare_cell",
    "fleet_verdict",
    "point_order",
    "runs_needed",
]

# Metrics where a larger value is worse (a longer wait, more energy); the others are speeds.
LOWER_IS_BETTER = frozenset({"ttft_ms_p90", "joules_per_token"})
# Efficiency, not speed: shown where worse, a hold only where the settings say so
ENERGY_METRICS = frozenset({"joules_per_token"})
# A class's median over this many nodes or more has a median's standard error, sqrt(pi/2)
# times the mean's; below it the median is the mean (of one or two).
_MEDIAN_SE = math.sqrt(math.pi / 2)
_CI_Z = 1.96  # a two-sided 95% interval
# The run-to-run spread assumed where a node's is not known yet (one run of a build): what
# this project's machines showed (docs/design/regressions.md), to say how many runs to ask for.
ASSUMED_NOISE = 0.03
MOST_LOG_RATIO = 700.0  # exp() of more overflows: a ratio beyond e^700 is no measurement
MOST_RUNS_ASKED = 50


@dataclass(frozen=True)
class CompareSettings:
    min_change: float = 0.05  # a smaller worsening never holds a rollout
    max_detectable: float = 0.10  # a class that cannot see a slowdown this large is unknown
    min_runs: int = 2  # runs of each build a node needs before its point counts
    hold_on_energy: bool = False  # more energy per token holds a rollout, not only shows
    outputs_min_kl: float = MIN_KL  # nats: outputs moved less than this are within the floor
    detection: DetectionSettings = field(default_factory=DetectionSettings)

    @property
    def z(self) -> float:
        """Standard errors a change must clear to be found with 95% probability."""
        return self.detection.z_known + DETECTION_POWER_Z


class PointKey(NamedTuple):
    metric: str
    pp: int
    tg: int
    b: int  # serving: the concurrency


class SideFigures(NamedTuple):
    """One build's runs at one point of one node."""

    runs: int
    mean: float


class ListedCell(NamedTuple):
    """A point of a node, both builds measured there, with the run-to-run noise its runs
    show (relative: the spread between runs pooled over both builds, never below the
    repeats' own nor the detector's floor; registry.compare.pairs weighs it)."""

    node: str
    key: PointKey
    before: SideFigures
    after: SideFigures
    noise: float


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


@dataclass(frozen=True)
class NodeSummary:
    """A node with runs of either build: on the hardware and settings with the most runs
    of both (`settings`; None: no such), how many, and the noisiest point its runs tell."""

    node: str
    hardware_class: str | None
    hardware: str | None
    settings: str | None
    runs_before: int  # on that hardware and settings, at its point with the most
    runs_after: int
    any_runs_before: int  # on any hardware and settings
    any_runs_after: int
    compared: bool  # both builds measured a point in common there
    noisiest: float | None  # of its points measured more than once on either side


@dataclass(frozen=True)
class ClassFigures:
    """A hardware class's nodes at one point, as registry.compare.pairs reduces them:
    the nodes with enough runs of both builds, the median of their log ratios, the sum of
    the ratios' log variances, and the worst node."""

    key: PointKey
    hardware_class: str | None
    nodes: int
    median_log_ratio: float
    variance: float
    worst_node: str
    worst_log_ratio: float


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

    def worse_beyond_noise(self, s: CompareSettings) -> bool:
        """Worse by at least the minimum change, and beyond noise: `significance` standard
        errors (the regression check's at a known change). `detectable` adds the power
        margin: what these runs could miss, which decides `unknown`, not `hold`."""
        return self.worse >= max(self.significant, s.min_change)

    def held(self, s: CompareSettings) -> bool:
        """Worse beyond noise, and a speed's (energy's only where the settings hold on it)."""
        energy = self.key.metric in ENERGY_METRICS
        return self.worse_beyond_noise(s) and (s.hold_on_energy or not energy)


@dataclass(frozen=True)
class ClassVerdict:
    hardware_class: str
    verdict: CompareVerdict
    reason: str
    nodes_compared: int
    nodes_not_compared: int
    cells: tuple[ClassCell, ...]
    runs_needed: int | None  # more runs of each build on each node (unknown only)
    efficiency: str | None = None  # where it costs more energy per token, and by how much
    outputs: OutputsVerdict | None = None  # what the model outputs (None: none compared)


@dataclass(frozen=True)
class FleetVerdict:
    verdict: CompareVerdict
    reason: str
    classes: tuple[ClassVerdict, ...]


def _worse(metric: str, ratio: float) -> float:
    return ratio - 1 if metric in LOWER_IS_BETTER else 1 - ratio


def compare_cell(cell: ListedCell, s: CompareSettings) -> CellComparison:
    """One point of one node, both builds measured there with positive means."""
    before, after = cell.before, cell.after
    log_ratio = math.log(after.mean) - math.log(before.mean)
    se = cell.noise * math.sqrt(1 / before.runs + 1 / after.runs)
    # a spread so wide its interval is no number: as wide as a float allows
    half = min(_CI_Z * se, 300.0)
    ratio = math.exp(min(log_ratio, MOST_LOG_RATIO))
    return CellComparison(
        key=cell.key,
        before=before,
        after=after,
        ratio=ratio,
        low=math.exp(min(log_ratio - half, MOST_LOG_RATIO)),  # (a tiny one is 0.0, no error)
        high=math.exp(min(log_ratio + half, MOST_LOG_RATIO)),
        noise=cell.noise,
        detectable=max(s.min_change, s.z * se),
        worse=_worse(cell.key.metric, ratio),
    )


def point_order(key: PointKey) -> tuple[str, int, int, int]:
    return (key.metric, key.pp, key.tg, key.b)


def class_cell(figures: ClassFigures, s: CompareSettings) -> ClassCell:
    """A class's point: its nodes' median ratio, and how far from noise it lies (the
    median's standard error, sqrt(pi/2) times the mean's from three nodes on)."""
    k = figures.nodes
    factor = _MEDIAN_SE if k >= 3 else 1.0
    se = factor * math.sqrt(figures.variance) / k
    median = math.exp(figures.median_log_ratio)
    return ClassCell(
        key=figures.key,
        nodes=k,
        ratio=median,
        worst_node=figures.worst_node,
        worst_ratio=math.exp(figures.worst_log_ratio),
        detectable=max(s.min_change, s.z * se),
        significant=s.detection.z_known * se,
        worse=_worse(figures.key.metric, median),
    )


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
    how = (
        "more"
        if cell.key.metric in ENERGY_METRICS
        else "longer"
        if cell.key.metric in LOWER_IS_BETTER
        else "slower"
    )
    worst = abs(_worse(cell.key.metric, cell.worst_ratio))
    return (
        f"{name} at {at} {cell.worse:.1%} {how} (median of {cell.nodes} node"
        f"{'s' if cell.nodes != 1 else ''}; worst {cell.worst_node} {worst:.1%}), "
        f"beyond the {cell.detectable:.1%} its runs tell from noise"
    )


def class_verdict(
    name: str,
    nodes: Sequence[NodeSummary],
    cells: Sequence[ClassCell],
    s: CompareSettings,
    metric_names: Mapping[str, str],
    outputs: OutputsVerdict | None = None,
) -> ClassVerdict:
    """A class's verdict from its nodes that ran the new build, its points and what its
    model outputs (a change beyond the class's floor holds it, however fast)."""
    compared = [n for n in nodes if n.compared]
    not_compared = len(nodes) - len(compared)
    speeds = [c for c in cells if c.key.metric not in ENERGY_METRICS]
    costlier = [c for c in cells if c.key.metric in ENERGY_METRICS and c.worse_beyond_noise(s)]
    efficiency = _worst_of(costlier, metric_names) if costlier else None
    held = [c for c in cells if c.held(s)]
    wrong = outputs is not None and outputs.state == "changed"
    if held or wrong:
        reasons = [outputs.reason] if outputs is not None and wrong else []
        reason = "; ".join(reasons + ([_worst_of(held, metric_names)] if held else []))
        return ClassVerdict(
            name,
            "hold",
            reason,
            len(compared),
            not_compared,
            tuple(cells),
            None,
            efficiency,
            outputs,
        )
    # energy figures are judged where they are, never asked more runs for
    blind = max((c.detectable for c in speeds), default=None)
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
            name,
            "unknown",
            reason,
            len(compared),
            not_compared,
            tuple(cells),
            more,
            efficiency,
            outputs,
        )
    reason = (
        f"no point slower beyond what its runs tell from noise (at most {blind:.1%}) over "
        f"{len(compared)} node{'s' if len(compared) != 1 else ''}"
    )
    return ClassVerdict(
        name, "go", reason, len(compared), not_compared, tuple(cells), None, efficiency, outputs
    )


def _worst_of(cells: Sequence[ClassCell], metric_names: Mapping[str, str]) -> str:
    """The worst of the cells described, and how many more there are."""
    worst = max(cells, key=lambda c: c.worse)
    also = f" (and {len(cells) - 1} more point{'s' if len(cells) > 2 else ''})"
    return _describe(worst, metric_names) + (also if len(cells) > 1 else "")


def _noisiest(nodes: Sequence[NodeSummary]) -> float:
    """The run-to-run spread to plan runs by: the noisiest point's where runs tell it, else
    ASSUMED_NOISE (one run of a build has no spread, only the floor)."""
    return max((n.noisiest for n in nodes if n.noisiest is not None), default=ASSUMED_NOISE)


def fleet_verdict(
    nodes: Iterable[NodeSummary],
    figures: Iterable[ClassFigures],
    s: CompareSettings,
    metric_names: Mapping[str, str],
    outputs: Mapping[str, OutputsVerdict] | None = None,
) -> FleetVerdict:
    """The verdict per hardware class of the nodes that ran the new build, and the fleet's
    (`figures`: each class's points; `outputs`: each class's outputs verdict)."""
    by_class: dict[str, list[NodeSummary]] = defaultdict(list)
    for node in nodes:
        if node.any_runs_after:
            by_class[node.hardware_class or UNKNOWN_CLASS].append(node)
    cells: dict[str, list[ClassCell]] = defaultdict(list)
    for found in sorted(figures, key=lambda f: point_order(f.key)):
        cells[found.hardware_class or UNKNOWN_CLASS].append(class_cell(found, s))
    classes = tuple(
        class_verdict(k, v, cells[k], s, metric_names, (outputs or {}).get(k))
        for k, v in sorted(by_class.items())
    )
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
