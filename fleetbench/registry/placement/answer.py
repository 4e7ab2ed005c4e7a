"""Placement, step by step: which node and concurrency meets X tokens/s per user for a
model (and a time to first token, when asked) and, given each user's context, holds every
user's KV cache beside the weights, by the model's facts as the node itself reported them
(registry.model_facts).

Each node answers from its latest serving run of the model where it has one and `kind`
allows (what users of the server the team runs get), else from its engine's offline curve.
The rows come from SQL (registry.placement.offline_rows: each node's offline choice, chosen and
ranked there; registry.placement.serving_rows: the serving points); the decisions are pure
functions (registry.placement.rules). What is done here: the fit caps, one per fit
config (nodes alike share one answer); the choice read again under those caps; the
concurrencies refused for memory; the listed nodes' KV sizes; offline and serving
candidates merged, best total throughput first.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from fleetbench.contract.answers import (
    FactsSource,
    FitBasis,
    PlacementAnswer,
    RejectedConcurrency,
)
from fleetbench.contract.kv_cache import KvPrediction, KvUnknown
from fleetbench.registry.model_facts import FleetFacts
from fleetbench.registry.models import Model
from fleetbench.registry.placement.offline_rows import (
    FitConfig,
    PlacementRows,
    fit_configs,
    memory_of,
    placement_rows,
)
from fleetbench.registry.placement.rules import (
    GIB,
    NodeChoice,
    NodePrice,
    PlacementFindings,
    PlacementQuestion,
    ServingChoices,
    answer_placement,
    largest_fitting_concurrency,
    serving_choices,
    why_fit_unchecked,
)
from fleetbench.registry.placement.serving_rows import serving_rows
from fleetbench.registry.prices.rules import usd_per_million_tokens
from fleetbench.registry.prices.store import classes_of_runs, prices_of
from fleetbench.registry.state import Bounded

__all__ = ["EVERY_NODE", "place"]

EVERY_NODE = 100_000  # placement's largest limit: every node's candidate


def place(
    session: Session,
    models: Sequence[Model],
    question: PlacementQuestion,
    *,
    classes: Bounded[uuid.UUID, str],
) -> PlacementAnswer:
    """The placement answer for the models (files sharing one name count as one model).
    A question's `max_ttft_ms` needs serving runs: with kind offline, ask without it.
    `classes`: the process's runs' hardware classes, read once (each candidate's)."""
    model_ids = [m.id for m in models]
    since = (
        datetime.now(UTC) - timedelta(days=question.max_age_days) if question.max_age_days else None
    )
    served = serving_choices(
        serving_rows(
            session.connection(),
            model_ids=model_ids,
            since=since,
            prompt_tokens=question.prompt_tokens,
        )
        if question.kind != "offline"
        else [],
        min_tps_per_user=question.min_tps_per_user,
        max_ttft_ms=question.max_ttft_ms,
        context_tokens=question.context_tokens,
    )

    # by cost, every qualifying node is priced before the first are listed
    listed = question.limit if question.order == "throughput" else EVERY_NODE

    def rows(caps: Mapping[FitConfig, int] | None = None, limit: int = listed) -> PlacementRows:
        return placement_rows(
            session,
            model_ids=model_ids,
            since=since,
            prompt_tokens=question.prompt_tokens,
            min_tps_per_user=question.min_tps_per_user,
            limit=limit,
            caps=caps,
            unserved=question.kind == "any",
        )

    rejected: list[RejectedConcurrency] = []
    unchecked: list[tuple[str, str, int]] = []
    caps: dict[FitConfig, int] = {}  # the most users that fit, by fit config (checked)
    facts = FleetFacts(session, models)
    untimed = 0
    if question.kind == "serving" or question.max_ttft_ms is not None:
        # Offline curves have no TTFT: asked for one, they only say how many nodes they'd add.
        offline = PlacementRows([], 0, None, None, {})
        untimed = rows(limit=1).qualifying_count if question.kind == "any" else 0
    elif question.context_tokens is None:
        offline = rows()
    else:
        for config, nodes, first in fit_configs(session, model_ids=model_ids, since=since):
            memory = memory_of(config, facts)
            if (why := why_fit_unchecked(memory)) is not None:
                unchecked.append((first, why, nodes))
            else:
                caps[config] = largest_fitting_concurrency(
                    memory, tokens_per_user=question.context_tokens
                )
        uncapped = rows()
        offline = rows(caps) if caps else uncapped
        rejected = _rejected(uncapped, caps, facts, question.context_tokens)
    offline_fits: dict[str, FitBasis] = {
        c.node: "measured buffers"
        if offline.configs[c.node].beside_kv_bytes is not None
        else "predicted only"
        for c in offline.qualifying
        if offline.configs[c.node] in caps
    }
    prices = _prices(session, [*offline.qualifying, *served.qualifying], classes)
    qualifying = _in_order(offline.qualifying, served.qualifying, question, prices)
    if question.order == "cost":  # the refusals of the nodes listed, not of the whole fleet
        shown = {choice.node for choice in qualifying}
        rejected = [refusal for refusal in rejected if refusal.node in shown]
    predicted = _kv_caches(offline, facts, question.context_tokens, qualifying)
    findings = PlacementFindings(
        qualifying=qualifying,
        qualifying_count=offline.qualifying_count + len(served.qualifying),
        fastest=_fastest(offline.fastest, served) if not served.qualifying else None,
        longest_prompt=offline.longest_prompt,
        rejected=rejected,
        unchecked=sorted(unchecked),
        kv_cache_bytes={node: _bytes(kv) for node, kv in predicted.items()},
        kv_rules={
            node: kv.rules if isinstance(kv, KvPrediction) else f"fit unknown: {kv.reason}"
            for node, kv in predicted.items()
        },
        fit_checked=offline_fits | _serving_fits(served, question.context_tokens),
        facts_from=_facts_sources(offline, facts),
        small_slots=served.small_slots,
        untimed=untimed,
        prices=prices,
    )
    return answer_placement(models[0].name, question, findings)


def _in_order(
    offline: Sequence[NodeChoice],
    serving: Sequence[NodeChoice],
    question: PlacementQuestion,
    prices: Mapping[str, NodePrice],
) -> list[NodeChoice]:
    """Both kinds of candidates (each best total throughput first) as one list in the
    question's order, the first `limit` of it: best total throughput first, or the cheapest
    per million tokens first (those without a price last, best throughput first)."""
    merged = sorted([*offline, *serving], key=lambda c: -c.s_tg)  # stable: ties keep order
    if question.order == "cost":

        def cost(choice: NodeChoice) -> tuple[bool, float]:
            price = prices.get(choice.node)
            usd = price.usd_per_hour if price is not None else None
            per_million = usd_per_million_tokens(usd, choice.s_tg) if usd else None
            return (per_million is None, per_million or 0.0)

        merged.sort(key=cost)
    return merged[: question.limit]


def _prices(
    session: Session, choices: Sequence[NodeChoice], held: Bounded[uuid.UUID, str]
) -> dict[str, NodePrice]:
    """Each candidate's hardware class (its run's) and the class's price per hour."""
    classes = classes_of_runs(session, {choice.run_id for choice in choices}, held)
    usd = prices_of(session, set(classes.values()))
    return {
        choice.node: NodePrice(hardware_class, usd.get(hardware_class))
        for choice in choices
        if (hardware_class := classes.get(choice.run_id)) is not None
    }


def _fastest(offline: NodeChoice | None, served: ServingChoices) -> NodeChoice | None:
    """The best per-user speed on offer when no node qualifies, of either kind."""
    offered = [c for c in (offline, served.fastest) if c is not None]
    return max(offered, key=lambda c: c.per_user_tps, default=None)


def _serving_fits(served: ServingChoices, context_tokens: int | None) -> dict[str, FitBasis]:
    """The serving candidates whose server holds the context asked for in each slot (its
    own allocation: those with smaller slots are left out)."""
    if context_tokens is None:
        return {}
    return {c.node: "server slots" for c in served.qualifying if c.ctx_per_slot is not None}


def _facts_sources(found: PlacementRows, facts: FleetFacts) -> dict[str, FactsSource]:
    """Whose model facts each listed node's figures use."""
    sources = {}
    for choice in found.qualifying:
        config = found.configs[choice.node]
        sources[choice.node] = facts.of(config.model_id, config.facts_id).source
    return sources


def _kv_caches(
    found: PlacementRows,
    facts: FleetFacts,
    context_tokens: int | None,
    listed: Sequence[NodeChoice],
) -> dict[str, KvPrediction | KvUnknown]:
    """The listed nodes' users' KV cache at their concurrency, at `context_tokens` each (or
    the point's own PP + TG), or why it cannot be said; nodes alike share one computation."""
    computed: dict[tuple[FitConfig, int, int], KvPrediction | KvUnknown] = {}
    caches = {}
    for choice in listed:
        if choice.node not in found.configs or choice.source != "offline":
            continue  # a serving candidate's cache is its server's
        config = found.configs[choice.node]
        tokens = context_tokens or choice.pp + choice.tg
        key = (config, choice.b, tokens)
        if key not in computed:
            memory = memory_of(config, facts)
            computed[key] = memory.kv_cache(concurrency=choice.b, tokens_per_user=tokens)
        caches[choice.node] = computed[key]
    return caches


def _bytes(kv: KvPrediction | KvUnknown) -> int | None:
    return kv.bytes if isinstance(kv, KvPrediction) else None


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
        kv = _bytes(memory.kv_cache(concurrency=choice.b, tokens_per_user=context_tokens)) or 0
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
