"""A comparison's arithmetic over whole columns: each build's sums per node and point
(registry.projections.build_sums) paired, weighed and reduced per hardware class with numpy.

A 1,000-node fleet's comparison pairs 12,000 points. Row by row in Python that is half a
second. So each build's sums are read as columns (registry.compare.rows) and reduced here
in a few vector operations; only the class and node figures and the listed points become
objects.

The statistics are those registry.compare.rules states: each side's mean, its spread
between runs and its repeats' noise; per point the pooled noise, the log of the ratio and
its standard error; per class and point the median log ratio, the sum of the nodes'
variances and the worst node. The judgement over them is the pure functions' there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fleetbench.registry.compare.rules import (
    ENERGY_METRICS,
    LOWER_IS_BETTER,
    MOST_LOG_RATIO,
    ClassFigures,
    ListedCell,
    NodeSummary,
    PointKey,
    SideFigures,
)
from fleetbench.registry.projections.build_sums import MOST_RELATIVE, SUM_COLUMNS

__all__ = ["KEY_COLUMNS", "ComparedRows", "Labels", "SumsTable", "compare_sums"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
# node, fingerprint (0: none), settings and runner (codes: Labels), metric (an index into
# Labels.metrics), PP, TG, B
KEY_COLUMNS = ("node", "fingerprint", "settings", "runner", "metric", "pp", "tg", "b")
_GROUP = slice(0, 4)  # a node's runs on one hardware and settings, with one engine


@dataclass(frozen=True)
class SumsTable:
    """Sums of runs per key (KEY_COLUMNS), as columns: `keys` is rows x 8, `sums` rows x 6."""

    keys: Ints
    sums: Floats

    @staticmethod
    def empty() -> SumsTable:
        return SumsTable(np.zeros((0, len(KEY_COLUMNS)), np.int64), np.zeros((0, len(SUM_COLUMNS))))

    def with_runner(self, code: int) -> SumsTable:
        """The table with its runner's code (one build's: one engine, backend, binding)."""
        keys = self.keys.copy()
        keys[:, 3] = code
        return SumsTable(keys, self.sums)

    @staticmethod
    def joined(tables: Sequence[SumsTable]) -> SumsTable:
        """The tables as one, rows of the same key summed (one side's several builds)."""
        if not tables:
            return SumsTable.empty()
        keys = np.concatenate([t.keys for t in tables])
        sums = np.concatenate([t.sums for t in tables])
        if len(tables) == 1 or not len(keys):
            return SumsTable(keys, sums)
        unique, inverse = unique_rows(keys)
        summed = np.zeros((len(unique), sums.shape[1]))
        np.add.at(summed, inverse, sums)
        return SumsTable(unique, summed)


def unique_rows(rows: Ints) -> tuple[Ints, Ints]:
    """The distinct rows of a 2-D array in order, and each row's index among them (what
    np.unique(axis=0) answers, several times faster: it sorts rows as opaque bytes)."""
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    new = np.r_[True, np.any(ordered[1:] != ordered[:-1], axis=1)]
    inverse = np.empty(len(rows), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


@dataclass(frozen=True)
class Labels:
    """What the codes and ids in the tables stand for."""

    texts: Sequence[str]  # settings and runners, by code
    metrics: Sequence[str]  # by index
    nodes: Mapping[int, str]  # node id -> name
    hardware: Mapping[int, tuple[str | None, str | None]]  # fingerprint -> description, class


@dataclass(frozen=True)
class ComparedRows:
    classes: list[ClassFigures]  # per hardware class and point
    nodes: list[NodeSummary]  # every node with runs of either build
    listed: list[ListedCell]  # the points of the `limit` nodes most worse at any point


def _figures(sums: Floats) -> tuple[Floats, Floats, Floats]:
    """Each row's mean, relative spread between runs (NaN: one run) and repeats' noise
    (NaN: no repeats)."""
    runs, total, squares, relative_sd, repeats, repeated = sums.T
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = total / runs
        variance = np.maximum(squares / runs - mean * mean, 0.0)
        deviation = np.sqrt(variance * runs / (runs - 1.0))
        relative = np.where(deviation < mean * MOST_RELATIVE, deviation / mean, MOST_RELATIVE)
        spread = np.where(runs >= 2, relative, np.nan)
        noise = np.where(
            (repeated > 0) & (repeats >= 2 * repeated),
            relative_sd / repeated / np.sqrt(repeats / repeated),
            np.nan,
        )
    return mean, spread, noise


def _pairs(before: SumsTable, after: SumsTable) -> tuple[Ints, Ints]:
    """The rows of `before` and of `after` with the same key, in key order."""
    keys = np.concatenate([before.keys, after.keys])
    side = np.concatenate(
        [np.zeros(len(before.keys), np.int64), np.ones(len(after.keys), np.int64)]
    )
    order = np.lexsort((side, *keys.T[::-1]))
    ordered = keys[order]
    same = np.all(ordered[1:] == ordered[:-1], axis=1)
    first = order[:-1][same]  # before (side 0 sorts first)
    second = order[1:][same] - len(before.keys)
    return first, second


def compare_sums(
    before: SumsTable,
    after: SumsTable,
    labels: Labels,
    *,
    noise_floor: float,
    min_runs: int,
    limit: int,
) -> ComparedRows:
    """Each node's points of the two builds compared on its hardware and settings with the
    most runs of both; the nodes' summaries; each class's figures per point."""
    # Groups: each side's runs at its point with the most, per node, hardware and settings.
    all_keys = np.concatenate([before.keys, after.keys])
    if not len(all_keys):
        return ComparedRows([], [], [])
    groups, inverse = unique_rows(all_keys[:, _GROUP])
    runs = np.zeros((len(groups), 2))
    np.maximum.at(runs[:, 0], inverse[: len(before.keys)], before.sums[:, 0])
    np.maximum.at(runs[:, 1], inverse[len(before.keys) :], after.sums[:, 0])
    chosen = _chosen_groups(groups, runs, labels)

    first, second = _pairs(before, after)
    in_chosen = np.isin(inverse[first], np.fromiter(chosen.values(), np.int64, len(chosen)))
    first, second = first[in_chosen], second[in_chosen]
    mean_b, spread_b, noise_b = (x[first] for x in _figures(before.sums))
    mean_a, spread_a, noise_a = (x[second] for x in _figures(after.sums))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(mean_a) - np.log(mean_b)
    usable = (mean_a > 0) & (mean_b > 0) & (np.abs(log_ratio) <= MOST_LOG_RATIO)  # beyond: left out
    first, second = first[usable], second[usable]
    mean_b, mean_a, spread_b, spread_a, noise_b, noise_a, log_ratio = (
        x[usable] for x in (mean_b, mean_a, spread_b, spread_a, noise_b, noise_a, log_ratio)
    )
    nb, na = before.sums[first, 0], after.sums[second, 0]
    degrees = np.where(np.isnan(spread_b), 0, nb - 1) + np.where(np.isnan(spread_a), 0, na - 1)
    pooled_sum = np.nan_to_num((nb - 1) * spread_b**2) + np.nan_to_num((na - 1) * spread_a**2)
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = np.where(degrees > 0, np.sqrt(pooled_sum / degrees), 0.0)
    noise = np.maximum.reduce(
        [pooled, np.nan_to_num(noise_b), np.nan_to_num(noise_a), np.full_like(pooled, noise_floor)]
    )
    keys = before.keys[first]
    metric = keys[:, 4]
    lower_is_better = np.isin(
        metric, [i for i, m in enumerate(labels.metrics) if m in LOWER_IS_BETTER]
    )
    badness = np.where(lower_is_better, log_ratio, -log_ratio)  # larger: worse
    variance = noise**2 * (1 / nb + 1 / na)
    # a node's worst change and its noisiest point are its speeds': energy is shown, never
    # what its runs are planned by or its nodes listed by
    speed = ~np.isin(metric, [i for i, m in enumerate(labels.metrics) if m in ENERGY_METRICS])

    node_ids, node_of = np.unique(keys[:, 0], return_inverse=True)
    worst = np.full(len(node_ids), -np.inf)
    np.maximum.at(worst, node_of[speed], badness[speed])
    told = ((nb > 1) | (na > 1)) & speed
    noisiest = np.full(len(node_ids), np.nan)
    np.fmax.at(noisiest, node_of[told], noise[told])
    cell_stats = {
        int(n): (float(noisiest[i]) if not np.isnan(noisiest[i]) else None, float(worst[i]))
        for i, n in enumerate(node_ids)
    }
    nodes = _node_summaries(groups, runs, chosen, cell_stats, labels)
    first_listed = sorted(cell_stats, key=lambda n: (-cell_stats[n][1], labels.nodes[n]))[:limit]
    listed = [
        ListedCell(
            labels.nodes[int(k[0])],
            PointKey(labels.metrics[int(k[4])], int(k[5]), int(k[6]), int(k[7])),
            SideFigures(int(nb[i]), float(mean_b[i])),
            SideFigures(int(na[i]), float(mean_a[i])),
            float(noise[i]),
        )
        for i in np.flatnonzero(np.isin(keys[:, 0], first_listed))
        for k in (keys[i],)
    ]
    enough = (nb >= min_runs) & (na >= min_runs)
    classes = _class_figures(
        keys[enough], log_ratio[enough], variance[enough], badness[enough], labels
    )
    return ComparedRows(classes, nodes, listed)


def _label(group: Ints, labels: Labels) -> str:
    """A group's settings and engine, as the answer names them."""
    return f"{labels.texts[int(group[2])]} on {labels.texts[int(group[3])]}".strip()


def _chosen_groups(groups: Ints, runs: Floats, labels: Labels) -> dict[int, int]:
    """Each node's group (an index into `groups`) with the most runs of both builds (ties:
    the most of the new one, then by fingerprint, settings and engine)."""
    both = np.flatnonzero((runs[:, 0] > 0) & (runs[:, 1] > 0))
    if not len(both):
        return {}
    found, rb, ra = groups[both], runs[both, 0], runs[both, 1]
    text_rank = np.empty(len(labels.texts), np.int64)  # codes in the texts' order
    text_rank[np.argsort(np.array(labels.texts, dtype=object))] = np.arange(len(text_rank))
    order = np.lexsort(
        (text_rank[found[:, 3]], text_rank[found[:, 2]], found[:, 1], -ra, -np.minimum(rb, ra),
         found[:, 0])
    )  # fmt: skip
    nodes = found[order, 0]
    first = np.r_[True, nodes[1:] != nodes[:-1]]
    return dict(zip(nodes[first].tolist(), both[order][first].tolist(), strict=True))


def _node_summaries(
    groups: Ints,
    runs: Floats,
    chosen: Mapping[int, int],
    cell_stats: Mapping[int, tuple[float | None, float]],
    labels: Labels,
) -> list[NodeSummary]:
    """Every node with runs of either build: its chosen group's runs (or why none), whether
    a point was compared there, and its hardware (the chosen group's, else that of a group
    with the new build, else any)."""
    node_ids, starts = np.unique(groups[:, 0], return_index=True)  # groups sorted by node
    most = np.maximum.reduceat(runs, starts, axis=0)
    # each node's first group with the new build (else its first group)
    with_new = np.where(runs[:, 1] > 0, np.arange(len(groups)), len(groups))
    first_new = np.minimum.reduceat(with_new, starts)
    fallback = np.where(first_new < len(groups), first_new, starts)
    summaries = []
    for n, node in enumerate(node_ids.tolist()):
        index = chosen.get(node)
        picked = index if index is not None else int(fallback[n])
        description, hardware_class = labels.hardware.get(int(groups[picked, 1]), (None, None))
        noisiest, _ = cell_stats.get(node, (None, 0.0))
        summaries.append(
            NodeSummary(
                node=labels.nodes[node],
                hardware_class=hardware_class,
                hardware=description,
                settings=_label(groups[index], labels) if index is not None else None,
                runs_before=int(runs[index, 0]) if index is not None else 0,
                runs_after=int(runs[index, 1]) if index is not None else 0,
                any_runs_before=int(most[n, 0]),
                any_runs_after=int(most[n, 1]),
                compared=node in cell_stats,
                noisiest=noisiest,
            )
        )
    return summaries


def _class_figures(
    keys: Ints, log_ratio: Floats, variance: Floats, badness: Floats, labels: Labels
) -> list[ClassFigures]:
    """Per hardware class and point: how many nodes, their median log ratio, the sum of
    their variances, and the worst node (ties: the first by name)."""
    if not len(keys):
        return []
    fingerprints, fingerprint_of = np.unique(keys[:, 1], return_inverse=True)
    named = [labels.hardware.get(f, (None, None))[1] or "" for f in fingerprints.tolist()]
    names = sorted(set(named))
    code = {name: i for i, name in enumerate(names)}
    class_of = np.array([code[n] for n in named], np.int64)[fingerprint_of.reshape(-1)]
    point = np.column_stack([class_of, keys[:, 4:8]])
    order = np.lexsort((log_ratio, *point.T[::-1]))
    ordered = point[order]
    starts = np.flatnonzero(np.r_[True, np.any(ordered[1:] != ordered[:-1], axis=1)])
    figures = []
    for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(order)], strict=True):
        rows = order[start:end]
        k = len(rows)
        ratios = log_ratio[rows]  # ascending
        median = float((ratios[(k - 1) // 2] + ratios[k // 2]) / 2)
        worst_badness = badness[rows].max()
        worst = min((labels.nodes[int(keys[i, 0])], i) for i in rows if badness[i] == worst_badness)
        c, metric, pp, tg, b = (int(x) for x in ordered[start])
        figures.append(
            ClassFigures(
                PointKey(labels.metrics[metric], pp, tg, b),
                names[c] or None,
                k,
                median,
                float(variance[rows].sum()),
                worst[0],
                float(log_ratio[worst[1]]),
            )
        )
    return figures
