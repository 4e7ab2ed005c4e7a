"""Which node and concurrency meets X tokens/s per user for a model?

Each node's choice (from its latest successful run: the largest concurrency whose per-user
decode speed S_TG / B meets X, at the smallest measured prompt length PP >= P when P is
given) is made in SQL by `crud.node_choices`: with 1,000 nodes, fetching every point into
Python costs more than the whole latency budget (bench/placement_latency.py). Decided here,
over those rows: the fleet's answer, its order, and why no node qualifies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from agent.wire import PlacementAnswer

__all__ = ["NodeChoice", "answer_placement"]


@dataclass(frozen=True)
class NodeChoice:
    """The point a node offers: the largest concurrency meeting the speed asked for or,
    when explaining why none does, the node's fastest point per user."""

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


def answer_placement(
    *,
    model: str,
    min_tps_per_user: float,
    qualifying: Iterable[NodeChoice],
    fastest: Iterable[NodeChoice] = (),
    prompt_tokens: int | None = None,
    longest_prompt: tuple[str, int] | None = None,
    max_age_days: float | None = None,
) -> PlacementAnswer:
    """The nodes that qualify, sorted by total decode throughput (highest first). When none
    does, the reason names the best available among each node's `fastest` point per user,
    or, when no node measured a prompt of `prompt_tokens`, the `longest_prompt` (node, PP)."""
    ranked = sorted(qualifying, key=lambda c: (-c.s_tg, c.node))
    best = max(fastest, key=lambda c: (c.per_user_tps, c.s_tg), default=None)
    if ranked:
        reason = f"{len(ranked)} node(s) meet {min_tps_per_user:g} tokens/s per user on {model}"
    elif best is not None:
        reason = (
            f"no node meets {min_tps_per_user:g} tokens/s per user on {model}; the best "
            f"available is {best.node} at concurrency {best.b} with "
            f"{best.per_user_tps:.2f} tokens/s per user ({best.s_tg:.2f} total, "
            f"prompt {best.pp} tokens)"
        )
    elif prompt_tokens is not None and longest_prompt is not None:
        node, pp = longest_prompt
        reason = (
            f"no node measured {model} with prompts of at least {prompt_tokens} tokens; "
            f"the longest measured is {pp} tokens (node {node})"
        )
    else:
        reason = f"no successful run of {model} has been reported"
        if max_age_days is not None:
            reason += f" in the last {max_age_days:g} days"
    return PlacementAnswer.model_validate(
        {
            "model": model,
            "min_tps_per_user": min_tps_per_user,
            "candidates": [_candidate(c) for c in ranked],
            "reason": reason,
        }
    )


def _candidate(choice: NodeChoice) -> dict[str, object]:
    return {
        "node": choice.node,
        "concurrency": choice.b,
        "per_user_tps": choice.per_user_tps,
        "total_tps": choice.s_tg,
        "prefill_tps": choice.s_pp,
        "prompt_tokens": choice.pp,
        "gen_tokens": choice.tg,
        "llama_cpp_build": choice.llama_cpp_build,
        "measured_at": choice.measured_at,
        "run_id": choice.run_id,
    }
