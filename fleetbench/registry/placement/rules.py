"""Which node and concurrency meets X tokens/s per user for a model?

Offline: each node's choice (from its latest successful run: the largest concurrency whose
per-user decode speed S_TG / B meets X, at the smallest measured prompt length PP >= P when
P is given) and their order (best total throughput first) are decided in SQL by
`registry.placement.offline_rows`, over the table of each node's latest curve: with 1,000 nodes,
fetching every point into Python costs more than the whole latency budget
(bench/placement_latency.py).

Serving: from each node's latest serving run (registry.placement.serving_rows), the largest
concurrency at which the p10 of per-user speed meets X, the p90 of the time to first token
meets the latency objective when one is given, and every request completed
(`serving_choices`, here).

Decided here, over those rows: the answer, and why no node qualifies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from uuid import UUID

from fleetbench.contract.answers import (
    BLIND_ABOVE_PCT,
    FactsSource,
    FitBasis,
    PlacementAnswer,
    PlacementKind,
    PlacementOrder,
    RejectedConcurrency,
)
from fleetbench.contract.energy import tokens_per_joule
from fleetbench.contract.kv_cache import (
    CacheShape,
    KvPrediction,
    KvUnknown,
    fits,
    predict_kv,
)
from fleetbench.contract.wire import ModelInfo
from fleetbench.registry.curves.knee import find_knee
from fleetbench.registry.prices.rules import usd_per_million_tokens

__all__ = [
    "GIB",
    "NodeChoice",
    "NodeMemory",
    "NodePrice",
    "PlacementFindings",
    "PlacementQuestion",
    "ServingChoices",
    "ServingRow",
    "answer_placement",
    "largest_fitting_concurrency",
    "serving_choices",
    "why_fit_unchecked",
    "why_kv_unknown",
]

GIB = 2**30


@dataclass(frozen=True)
class NodeChoice:
    """The point a node offers: the largest concurrency meeting the speed asked for or,
    when explaining why none does, the node's fastest point per user. Offline: a point of
    the engine's curve (B, S_TG, S_PP); serving: a concurrency of the server's run (C, its
    output tokens/s as S_TG, the p10 of per-user speed, TTFT p90)."""

    node: str
    run_id: UUID
    measured_at: datetime
    llama_cpp_build: int | None
    pp: int
    tg: int
    b: int
    s_pp: float | None
    s_tg: float
    past_knee: bool | None = None  # beyond the knee of the curve it lies on (None: unknown)
    mbu: float | None = None  # offline: its memory-bandwidth utilisation (contract.bandwidth)
    joules: float | None = None  # offline: what it cost in energy (contract.energy)
    energy_source: str | None = None  # offline: the counter of its joules
    source: Literal["offline", "serving"] = "offline"
    per_user_p10: float | None = None  # serving: what the slowest tenth of users got
    ttft_ms_p90: float | None = None
    server: str | None = None  # serving: the server's kind
    slots: int | None = None
    ctx_per_slot: int | None = None
    engine_on_accelerator: bool | None = None  # offline: did it measure the node's GPU
    # offline: the smallest step its S_TG series shows at a new build (None: not known yet)
    min_detectable_change: float | None = None

    @property
    def per_user_tps(self) -> float:
        if self.source == "serving":
            return self.per_user_p10 or 0.0
        return self.s_tg / self.b


@dataclass(frozen=True)
class ServingRow:
    """One concurrency of a node's latest serving run of a model."""

    node: str
    run_id: UUID
    measured_at: datetime
    llama_cpp_build: int | None
    server: str
    prompt_tokens: int
    gen_tokens: int
    slots: int | None
    ctx_per_slot: int | None
    concurrency: int
    total_tps: float | None
    per_user_tps_p10: float | None
    ttft_ms_p90: float | None
    clean: bool  # every request of it completed


@dataclass(frozen=True)
class ServingChoices:
    qualifying: list[NodeChoice]  # best total throughput first
    fastest: NodeChoice | None  # when none qualifies: the best p10 per-user speed on offer
    small_slots: list[tuple[str, int]]  # (node, tokens per slot) too small for the context
    nodes: set[str]  # the nodes with a serving run considered


def serving_choices(
    rows: Sequence[ServingRow],
    *,
    min_tps_per_user: float,
    max_ttft_ms: float | None,
    context_tokens: int | None,
) -> ServingChoices:
    """Each node's choice from its serving points (`rows`, by node): the largest concurrency
    where every request completed, the p10 of per-user speed meets `min_tps_per_user` and
    the p90 TTFT `max_ttft_ms`; a node whose server holds fewer tokens per slot than
    `context_tokens` offers none (its slots are what the server allocated)."""
    by_node: dict[str, list[ServingRow]] = {}
    for row in rows:
        by_node.setdefault(row.node, []).append(row)
    qualifying: list[NodeChoice] = []
    offered: list[NodeChoice] = []
    small: list[tuple[str, int]] = []
    for node, points in by_node.items():
        slot = points[0].ctx_per_slot
        if context_tokens is not None and slot is not None and slot < context_tokens:
            small.append((node, slot))
            continue
        measured = [(p, p.total_tps) for p in points if p.total_tps is not None]
        knee = find_knee([(p.concurrency, tps) for p, tps in measured])
        choices = [(p, _serving_choice(p, knee)) for p, _ in measured]
        meeting = [
            choice
            for point, choice in choices
            if point.clean
            and choice.per_user_tps >= min_tps_per_user
            and (max_ttft_ms is None or (point.ttft_ms_p90 or math.inf) <= max_ttft_ms)
        ]
        if meeting:
            qualifying.append(max(meeting, key=lambda c: (c.b, c.s_tg)))
        elif choices:
            offered.append(max((c for _, c in choices), key=lambda c: (c.per_user_tps, c.s_tg)))
    qualifying.sort(key=lambda c: (-c.s_tg, c.node))
    fastest = max(offered, key=lambda c: (c.per_user_tps, c.s_tg), default=None)
    return ServingChoices(qualifying, None if qualifying else fastest, small, set(by_node))


def _serving_choice(row: ServingRow, knee: int | None) -> NodeChoice:
    return NodeChoice(
        node=row.node,
        run_id=row.run_id,
        measured_at=row.measured_at,
        llama_cpp_build=row.llama_cpp_build,
        pp=row.prompt_tokens,
        tg=row.gen_tokens,
        b=row.concurrency,
        s_pp=None,
        s_tg=row.total_tps or 0.0,
        past_knee=knee is not None and row.concurrency > knee,
        source="serving",
        per_user_p10=row.per_user_tps_p10,
        ttft_ms_p90=row.ttft_ms_p90,
        server=row.server,
        slots=row.slots,
        ctx_per_slot=row.ctx_per_slot,
    )


@dataclass(frozen=True)
class NodeMemory:
    """What checking a node's fit takes: the memory the weights and KV cache must share
    (registry.hardware), the model's architecture and the cache settings of the
    node's latest run."""

    node: str
    memory_bytes: int | None
    model: ModelInfo
    cache_type_k: str | None
    cache_type_v: str | None
    n_ubatch: int | None
    # the weights, compute and output buffers of the node's latest run as llama.cpp allocated
    # them; None: not logged, the fit is checked with the file's size (predicted only)
    beside_kv_bytes: int | None = None
    build: int | None = None  # the llama.cpp build of the node's latest run
    flash_attn: str | None = None  # and its settings
    swa_full: bool | None = None

    def _shape(self, concurrency: int, tokens_per_user: int) -> CacheShape:
        return CacheShape(
            n_ctx=concurrency * tokens_per_user,
            n_seq=concurrency,
            n_ubatch=self.n_ubatch or 512,
            cache_type_k=self.cache_type_k or "f16",
            cache_type_v=self.cache_type_v or "f16",
            swa_full=bool(self.swa_full),
            flash_attn=self.flash_attn,
            build=self.build,
        )

    def kv_cache(self, *, concurrency: int, tokens_per_user: int) -> KvPrediction | KvUnknown:
        """The users' KV cache and the rules of the node's build that size it, or why it
        cannot be said ("fit unknown")."""
        return predict_kv(self.model, self._shape(concurrency, tokens_per_user))

    def shortfall(self, *, concurrency: int, tokens_per_user: int) -> str | None:
        """Why these users' KV caches and the weights do not fit the node's memory (the
        agent's own check, fleetbench.contract.kv_cache.fits), or None when they do; `memory`
        must be checkable (why_fit_unchecked is None)."""
        return fits(
            self.model,
            self._shape(concurrency, tokens_per_user),
            free_bytes=self.memory_bytes,
            beside_bytes=self.beside_kv_bytes,
        )


def why_kv_unknown(memory: NodeMemory) -> str | None:
    """Why the KV cache's size cannot be computed ("fit unknown"), or None when it can."""
    found = memory.kv_cache(concurrency=1, tokens_per_user=256)
    return found.reason if isinstance(found, KvUnknown) else None


def why_fit_unchecked(memory: NodeMemory) -> str | None:
    """Why the fit of this node cannot be checked, or None when it can."""
    if memory.memory_bytes is None:
        return "its memory is unknown (no hardware fingerprint with a memory size)"
    if (why := why_kv_unknown(memory)) is not None:
        return why
    if memory.model.file_size is None:
        return "the model's file size is unknown"
    return None


def largest_fitting_concurrency(memory: NodeMemory, *, tokens_per_user: int) -> int:
    """The most users whose KV caches of `tokens_per_user` each fit beside the weights
    (0: not even one); `memory` must be checkable (why_fit_unchecked is None). The KV cache
    only grows with the users, so a doubling then a bisection finds it."""

    def fit(concurrency: int) -> bool:
        return memory.shortfall(concurrency=concurrency, tokens_per_user=tokens_per_user) is None

    if not fit(1):
        return 0
    low, high = 1, 2
    while high < 2**31 and fit(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if fit(middle):
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class PlacementQuestion:
    """What placement is asked (GET /v1/placement's parameters; capacity asks it too)."""

    min_tps_per_user: float
    prompt_tokens: int | None = None
    context_tokens: int | None = None
    max_age_days: float | None = None
    kind: PlacementKind = "any"
    max_ttft_ms: float | None = None
    limit: int = 100  # candidates listed
    order: PlacementOrder = "throughput"


@dataclass(frozen=True)
class NodePrice:
    """A candidate's hardware class and its price per hour (None: none is set)."""

    hardware_class: str
    usd_per_hour: float | None


@dataclass(frozen=True)
class PlacementFindings:
    """What the rows and the fit checks found. `qualifying`: best total throughput first, the
    first of `qualifying_count`. When none does, the reason names the `fastest` point per
    user, or, when no node measured a prompt of the question's length, the `longest_prompt`.
    `unchecked`: (a node, why its fit is not checked, how many nodes alike).
    `kv_cache_bytes`: each listed node's users' KV cache at its concurrency; `kv_rules`:
    which rules predicted it, or "fit unknown: <why>" where none can; `fit_checked`: the
    nodes whose fit was checked, and against what; `facts_from`: whose model facts each
    listed node's figures used. `small_slots`: serving nodes left out, their server holding
    fewer tokens per slot than the context asked; `untimed`: nodes meeting the speed on
    their offline curves alone, left out for want of a TTFT to check the question's against."""

    qualifying: Sequence[NodeChoice]
    qualifying_count: int
    fastest: NodeChoice | None = None
    longest_prompt: tuple[str, int] | None = None
    rejected: Sequence[RejectedConcurrency] = ()
    unchecked: Sequence[tuple[str, str, int]] = ()
    kv_cache_bytes: Mapping[str, int | None] = field(default_factory=dict)
    kv_rules: Mapping[str, str] = field(default_factory=dict)
    fit_checked: Mapping[str, FitBasis] = field(default_factory=dict)
    facts_from: Mapping[str, FactsSource] = field(default_factory=dict)
    small_slots: Sequence[tuple[str, int]] = ()
    untimed: int = 0
    prices: Mapping[str, NodePrice] = field(default_factory=dict)  # by node


def answer_placement(
    model: str, question: PlacementQuestion, found: PlacementFindings
) -> PlacementAnswer:
    """The answer to `question` about `model`, from what was `found`."""
    return PlacementAnswer.model_validate(
        {
            "model": model,
            "min_tps_per_user": question.min_tps_per_user,
            "kind": question.kind,
            "max_ttft_ms": question.max_ttft_ms,
            "context_tokens": question.context_tokens,
            "order": question.order,
            "count": found.qualifying_count,
            "candidates": [
                _candidate(
                    c,
                    found.kv_cache_bytes.get(c.node),
                    found.kv_rules.get(c.node),
                    found.fit_checked.get(c.node),
                    found.facts_from.get(c.node, "none"),
                    found.prices.get(c.node),
                )
                for c in found.qualifying
            ],
            "rejected": found.rejected,
            "reason": _reason(model, question, found),
        }
    )


def _reason(model: str, question: PlacementQuestion, found: PlacementFindings) -> str:
    """Why the answer is what it is, in one paragraph: how many qualify or why none does,
    then what was left out and what the listed figures cannot say."""
    qualifying, fastest = found.qualifying, found.fastest
    asked = f"{question.min_tps_per_user:g} tokens/s per user"
    if question.max_ttft_ms is not None:
        asked += f" with a first token within {question.max_ttft_ms:g} ms (p90)"
    if qualifying:
        reason = f"{found.qualifying_count} node(s) meet {asked} on {model}"
        sources = {c.source for c in qualifying}
        if len(sources) > 1:
            served = sum(c.source == "serving" for c in qualifying)
            reason += (
                f" ({served} listed from their serving runs, {len(qualifying) - served} from "
                "their offline curves)"
            )
        if question.order == "cost":
            unpriced = sum(
                (price := found.prices.get(c.node)) is None or price.usd_per_hour is None
                for c in qualifying
            )
            reason += "; the cheapest per million tokens first"
            if unpriced:
                reason += f", {unpriced} without a price for their hardware class last"
            if found.qualifying_count > len(qualifying):
                reason += f"; the {len(qualifying)} first are listed"
        elif found.qualifying_count > len(qualifying):
            reason += f"; the {len(qualifying)} with the highest total throughput are listed"
    elif fastest is not None:
        reason = (
            f"no node meets {asked} on {model}; the best available is {fastest.node} at "
            f"concurrency {fastest.b} with {fastest.per_user_tps:.2f} tokens/s per user"
        )
        if fastest.source == "serving":
            ttft = "-" if fastest.ttft_ms_p90 is None else f"{fastest.ttft_ms_p90:.0f}"
            reason += (
                f" (p10 of its serving run, {fastest.s_tg:.2f} total, TTFT p90 {ttft} ms, "
                f"prompt {fastest.pp} tokens)"
            )
        else:
            reason += f" ({fastest.s_tg:.2f} total, prompt {fastest.pp} tokens)"
    elif found.untimed:
        reason = (
            f"no node has a serving run of {model} to check a time to first token against; "
            f"{found.untimed} node(s) meet {question.min_tps_per_user:g} tokens/s per user on "
            "their offline curves (`fleetbench-agent serve-sweep` measures TTFT)"
        )
    elif found.rejected:
        reason = (
            f"no node meets {question.min_tps_per_user:g} tokens/s per user on {model} with "
            f"{question.context_tokens} tokens of context per user: the KV cache of every "
            "concurrency fast enough would not fit (see rejected)"
        )
    elif question.prompt_tokens is not None and found.longest_prompt is not None:
        node, pp = found.longest_prompt
        reason = (
            f"no node measured {model} with prompts of at least {question.prompt_tokens} tokens; "
            f"the longest measured is {pp} tokens (node {node})"
        )
    else:
        reason = f"no successful run of {model} has been reported"
        if question.max_age_days is not None:
            reason += f" in the last {question.max_age_days:g} days"
    if found.rejected and (qualifying or fastest is not None):
        reason += (
            f"; {len(found.rejected)} faster choice(s) refused: their KV cache at "
            f"{question.context_tokens} tokens per user would not fit"
        )
    if found.unchecked:
        node, why, _ = found.unchecked[0]
        nodes = sum(count for _, _, count in found.unchecked)
        reason += f"; KV-cache fit unknown for {nodes} node(s) ({node}: {why})"
    if found.untimed and (qualifying or fastest is not None):
        reason += (
            f"; {found.untimed} node(s) meeting the speed on their offline curves alone are left "
            "out: TTFT is measured by serving sweeps"
        )
    if off := [c.node for c in qualifying if c.engine_on_accelerator is False]:
        reason += (
            f"; {len(off)} listed node(s) measured the engine on the CPU although they have a "
            f"GPU ({off[0]}): their figures are not their GPU's"
        )
    blind = [c for c in qualifying if 100 * (c.min_detectable_change or 0) > BLIND_ABOVE_PCT]
    if blind:
        reason += (
            f"; the series of {len(blind)} listed node(s) cannot show a "
            f"{BLIND_ABOVE_PCT:g}% slowdown ({blind[0].node}: "
            f"{100 * (blind[0].min_detectable_change or 0):.0f}% at the least): sweep with "
            "repeats = auto, or more often"
        )
    predicted = [c.node for c in qualifying if found.fit_checked.get(c.node) == "predicted only"]
    if predicted:
        reason += (
            f"; the fit of {len(predicted)} listed node(s) is predicted only ({predicted[0]}: "
            "its latest run logged no buffers, so the model file's size stands for the "
            "weights and compute)"
        )
    if found.small_slots:
        node, tokens = found.small_slots[0]
        reason += (
            f"; {len(found.small_slots)} node(s) left out: their server holds fewer than "
            f"{question.context_tokens} tokens per slot ({node}: {tokens})"
        )
    return reason


def _candidate(
    choice: NodeChoice,
    kv_bytes: int | None,
    kv_rules: str | None,
    fit_basis: FitBasis | None,
    facts_from: FactsSource,
    price: NodePrice | None,
) -> dict[str, object]:
    usd = price.usd_per_hour if price is not None else None
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
        "past_knee": choice.past_knee,
        "mbu": choice.mbu,
        "tokens_per_joule": tokens_per_joule(choice.b, choice.tg, choice.joules),
        "energy_source": choice.energy_source if choice.joules is not None else None,
        "hardware_class": price.hardware_class if price is not None else None,
        "usd_per_hour": usd,
        "usd_per_million_tokens": usd_per_million_tokens(usd, choice.s_tg) if usd else None,
        "kv_cache_gib": kv_bytes / GIB if kv_bytes is not None else None,
        "kv_rules": kv_rules,
        "fit": "fits" if fit_basis is not None else "not checked",
        "fit_basis": fit_basis,
        "facts_from": facts_from,
        "source": choice.source,
        "ttft_ms_p90": choice.ttft_ms_p90,
        "server": choice.server,
        "slots": choice.slots,
        "engine_on_accelerator": choice.engine_on_accelerator,
        "min_detectable_change_pct": (
            round(100 * choice.min_detectable_change, 2)
            if choice.min_detectable_change is not None
            else None
        ),
    }
