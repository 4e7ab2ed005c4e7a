"""Placement, step by step: which node and concurrency meets X tokens/s per user for a
model and, given each user's context, holds every user's KV cache beside the weights,
by the model's facts as the node itself reported them (registry.model_facts).

The rows come from SQL (registry.placement_rows: each node's choice, chosen and ranked
there); the decisions are pure functions (registry.questions.placement). What is done here:
the fit caps, one per fit config (nodes alike share one answer); the choice read again
under those caps; the concurrencies refused for memory; the listed nodes' KV sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from fleetbench.contract.answers import FactsSource, PlacementAnswer, RejectedConcurrency
from fleetbench.registry.model_facts import FleetFacts
from fleetbench.registry.models import Model
from fleetbench.registry.placement_rows import (
    FitConfig,
    PlacementRows,
    fit_configs,
    memory_of,
    placement_rows,
)
from fleetbench.registry.questions.placement import (
    GIB,
    answer_placement,
    largest_fitting_concurrency,
    why_fit_unchecked,
)

__all__ = ["place"]


def place(
    session: Session,
    models: Sequence[Model],
    *,
    min_tps_per_user: float,
    prompt_tokens: int | None = None,
    context_tokens: int | None = None,
    max_age_days: float | None = None,
    limit: int = 100,
) -> PlacementAnswer:
    """The placement answer for the models (files sharing one name count as one model)."""
    model_ids = [m.id for m in models]
    since = datetime.now(UTC) - timedelta(days=max_age_days) if max_age_days else None

    def rows(caps: Mapping[FitConfig, int] | None = None) -> PlacementRows:
        return placement_rows(
            session,
            model_ids=model_ids,
            since=since,
            prompt_tokens=prompt_tokens,
            min_tps_per_user=min_tps_per_user,
            limit=limit,
            caps=caps,
        )

    rejected: list[RejectedConcurrency] = []
    unchecked: list[tuple[str, str, int]] = []
    caps: dict[FitConfig, int] = {}  # the most users that fit, by fit config (checked)
    facts = FleetFacts(session, models)
    if context_tokens is None:
        found = rows()
    else:
        for config, nodes, first in fit_configs(session, model_ids=model_ids, since=since):
            memory = memory_of(config, facts)
            if (why := why_fit_unchecked(memory)) is not None:
                unchecked.append((first, why, nodes))
            else:
                caps[config] = largest_fitting_concurrency(memory, tokens_per_user=context_tokens)
        uncapped = rows()
        found = rows(caps) if caps else uncapped
        rejected = _rejected(uncapped, caps, facts, context_tokens)
    return answer_placement(
        model=models[0].name,
        min_tps_per_user=min_tps_per_user,
        qualifying=found.qualifying,
        qualifying_count=found.qualifying_count,
        fastest=found.fastest,
        prompt_tokens=prompt_tokens,
        longest_prompt=found.longest_prompt,
        max_age_days=max_age_days,
        context_tokens=context_tokens,
        rejected=rejected,
        unchecked=sorted(unchecked),
        kv_cache_bytes=_kv_sizes(found, facts, context_tokens),
        fit_checked={c.node for c in found.qualifying if found.configs[c.node] in caps},
        facts_from=_facts_sources(found, facts),
    )


def _facts_sources(found: PlacementRows, facts: FleetFacts) -> dict[str, FactsSource]:
    """Whose model facts each listed node's figures use."""
    sources = {}
    for choice in found.qualifying:
        config = found.configs[choice.node]
        sources[choice.node] = facts.of(config.model_id, config.facts_id).source
    return sources


def _kv_sizes(
    found: PlacementRows,
    facts: FleetFacts,
    context_tokens: int | None,
) -> dict[str, int | None]:
    """The listed nodes' users' KV cache at their concurrency, at `context_tokens` each (or
    the point's own PP + TG); nodes alike share one computation."""
    sizes: dict[tuple[FitConfig, int, int], int | None] = {}
    found_sizes = {}
    for choice in found.qualifying:
        config = found.configs[choice.node]
        tokens = context_tokens or choice.pp + choice.tg
        key = (config, choice.b, tokens)
        if key not in sizes:
            memory = memory_of(config, facts)
            sizes[key] = memory.kv_bytes(concurrency=choice.b, tokens_per_user=tokens)
        found_sizes[choice.node] = sizes[key]
    return found_sizes


def _rejected(
    uncapped: PlacementRows,
    caps: Mapping[FitConfig, int],
    facts: FleetFacts,
    context_tokens: int,
) -> list[RejectedConcurrency]:
    """The concurrencies that met the speed but whose KV cache would not fit."""
    refused = []
    for choice in uncapped.qualifying:
        config = uncapped.configs[choice.node]
        cap = caps.get(config)
        if cap is None or choice.b <= cap:
            continue
        memory = memory_of(config, facts)
        kv = memory.kv_bytes(concurrency=choice.b, tokens_per_user=context_tokens) or 0
        shortfall = memory.shortfall(concurrency=choice.b, tokens_per_user=context_tokens)
        refused.append(
            RejectedConcurrency(
                node=choice.node,
                concurrency=choice.b,
                kv_cache_gib=kv / GIB,
                reason=f"{choice.b} users x {context_tokens} tokens: {shortfall}"
                + (f" (at most {cap} users fit)" if cap else " (not even one user fits)"),
            )
        )
    return refused
