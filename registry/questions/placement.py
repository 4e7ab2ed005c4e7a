"""Which node and concurrency meets X tokens/s per user for a model?"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

__all__ = ["Candidate", "MeasuredPoint", "Placement", "place"]


@dataclass(frozen=True)
class MeasuredPoint:
    """A measured point of a node's latest successful run of the model."""

    node: str
    run_id: UUID
    measured_at: datetime
    llama_cpp_build: int | None
    pp: int
    tg: int
    b: int
    s_pp: float | None
    s_tg: float

    @property
    def per_user_tps(self) -> float:
        return self.s_tg / self.b


@dataclass(frozen=True)
class Candidate:
    node: str
    concurrency: int
    per_user_tps: float
    total_tps: float
    prefill_tps: float | None
    prompt_tokens: int
    gen_tokens: int
    llama_cpp_build: int | None
    measured_at: datetime
    run_id: UUID


@dataclass(frozen=True)
class Placement:
    candidates: list[Candidate]
    reason: str


def place(
    points: Iterable[MeasuredPoint],
    *,
    model: str,
    min_tps_per_user: float,
    prompt_tokens: int | None = None,
) -> Placement:
    """One candidate per node: the largest concurrency whose per-user decode speed (S_TG / B)
    meets `min_tps_per_user`. With `prompt_tokens`, only points measured at PP >= it count,
    and of those the smallest such PP (the closest measured prompt length). Candidates are
    sorted by total decode throughput, highest first; `reason` says why there are none."""
    by_node: dict[str, list[MeasuredPoint]] = {}
    for point in points:
        by_node.setdefault(point.node, []).append(point)
    if not by_node:
        return Placement([], f"no successful run of {model} has been reported")

    considered: list[MeasuredPoint] = []
    for node_points in by_node.values():
        considered.extend(_at_prompt_length(node_points, prompt_tokens))
    if not considered:
        longest = max((p for ps in by_node.values() for p in ps), key=lambda p: p.pp)
        return Placement(
            [],
            f"no node measured {model} with prompts of at least {prompt_tokens} tokens; "
            f"the longest measured is {longest.pp} tokens (node {longest.node})",
        )

    best_per_node: dict[str, MeasuredPoint] = {}
    for point in considered:
        if point.per_user_tps < min_tps_per_user:
            continue
        current = best_per_node.get(point.node)
        if current is None or (point.b, point.s_tg) > (current.b, current.s_tg):
            best_per_node[point.node] = point

    candidates = sorted(
        (_candidate(p) for p in best_per_node.values()),
        key=lambda c: (-c.total_tps, c.node),
    )
    if candidates:
        return Placement(
            candidates,
            f"{len(candidates)} of {len(by_node)} node(s) meet {min_tps_per_user:g} tokens/s "
            f"per user on {model}",
        )
    fastest = max(considered, key=lambda p: (p.per_user_tps, p.s_tg))
    return Placement(
        [],
        f"no node meets {min_tps_per_user:g} tokens/s per user on {model}; the best available "
        f"is {fastest.node} at concurrency {fastest.b} with {fastest.per_user_tps:.2f} "
        f"tokens/s per user ({fastest.s_tg:.2f} total, prompt {fastest.pp} tokens)",
    )


def _at_prompt_length(
    node_points: list[MeasuredPoint], prompt_tokens: int | None
) -> list[MeasuredPoint]:
    if prompt_tokens is None:
        return node_points
    long_enough = [p for p in node_points if p.pp >= prompt_tokens]
    if not long_enough:
        return []
    closest = min(p.pp for p in long_enough)
    return [p for p in long_enough if p.pp == closest]


def _candidate(point: MeasuredPoint) -> Candidate:
    return Candidate(
        node=point.node,
        concurrency=point.b,
        per_user_tps=point.per_user_tps,
        total_tps=point.s_tg,
        prefill_tps=point.s_pp,
        prompt_tokens=point.pp,
        gen_tokens=point.tg,
        llama_cpp_build=point.llama_cpp_build,
        measured_at=point.measured_at,
        run_id=point.run_id,
    )
