"""Which node and concurrency meets X tokens/s per user for a model?

Each node's choice (from its latest successful run: the largest concurrency whose per-user
decode speed S_TG / B meets X, at the smallest measured prompt length PP >= P when P is
given) and their order (best total throughput first) are decided in SQL by
`crud.placement_rows`: with 1,000 nodes, fetching every point into Python costs more than the
whole latency budget (bench/placement_latency.py). Decided here, over those rows: the
answer, and why no node qualifies.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    qualifying: Sequence[NodeChoice],
    qualifying_count: int,
    fastest: NodeChoice | None = None,
    prompt_tokens: int | None = None,
    longest_prompt: tuple[str, int] | None = None,
    max_age_days: float | None = None,
) -> PlacementAnswer:
    """The answer for the nodes that qualify (`qualifying`: best total throughput first, the
    first of `qualifying_count`). When none does, the reason names the `fastest` point per
    user, or, when no node measured a prompt of `prompt_tokens`, the `longest_prompt`."""
    if qualifying:
        reason = (
            f"{qualifying_count} node(s) meet {min_tps_per_user:g} tokens/s per user on {model}"
        )
        if qualifying_count > len(qualifying):
            reason += f"; the {len(qualifying)} with the highest total throughput are listed"
    elif fastest is not None:
        reason = (
            f"no node meets {min_tps_per_user:g} tokens/s per user on {model}; the best "
            f"available is {fastest.node} at concurrency {fastest.b} with "
            f"{fastest.per_user_tps:.2f} tokens/s per user ({fastest.s_tg:.2f} total, "
            f"prompt {fastest.pp} tokens)"
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
            "count": qualifying_count,
            "candidates": [_candidate(c) for c in qualifying],
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
