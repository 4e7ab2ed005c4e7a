from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Response

from agent.wire import ModelInfo, PlacementAnswer, RejectedConcurrency
from registry import latest
from registry.deps import ReadAccess, SessionDep, models_or_404
from registry.latest import FitConfig
from registry.params import MAX_AGE_DAYS, MAX_FIGURE, MAX_TOKENS, ModelQuery
from registry.questions.placement import (
    GIB,
    answer_placement,
    largest_fitting_concurrency,
    why_fit_unchecked,
)
from registry.responses import NOT_FOUND

router = APIRouter(tags=["questions"], dependencies=[ReadAccess])


@router.get("/placement", response_model=PlacementAnswer, responses=NOT_FOUND)
def read_placement(
    session: SessionDep,
    model: ModelQuery,
    min_tps_per_user: Annotated[float, Query(ge=0, le=MAX_FIGURE, allow_inf_nan=False)],
    prompt_tokens: Annotated[int | None, Query(ge=0, le=MAX_TOKENS)] = None,
    context_tokens: Annotated[
        int | None,
        Query(ge=1, le=MAX_TOKENS, description="tokens each user's conversation holds"),
    ] = None,
    max_age_days: Annotated[float | None, Query(gt=0, le=MAX_AGE_DAYS, allow_inf_nan=False)] = None,
    limit: Annotated[
        int, Query(ge=1, le=100_000, description="list at most this many candidates")
    ] = 100,
) -> Response:
    """Which node and concurrency meets `min_tps_per_user` decode tokens/s per user and,
    given `context_tokens`, holds every user's KV cache beside the weights?"""
    models = models_or_404(session, model)
    model_ids = [m.id for m in models]
    since = datetime.now(UTC) - timedelta(days=max_age_days) if max_age_days else None

    def rows(caps: Mapping[FitConfig, int] | None = None) -> latest.PlacementRows:
        return latest.placement_rows(
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
    infos = latest.model_infos(session, model_ids)
    if context_tokens is None:
        found = rows()
    else:
        # Nodes alike (memory, model, cache settings) share one answer.
        for config, nodes, first in latest.fit_configs(session, model_ids=model_ids, since=since):
            memory = latest.memory_of(config, infos[config.model_id])
            if (why := why_fit_unchecked(memory)) is not None:
                unchecked.append((first, why, nodes))
            else:
                caps[config] = largest_fitting_concurrency(memory, tokens_per_user=context_tokens)
        uncapped = rows()
        found = rows(caps) if caps else uncapped
        rejected = _rejected(uncapped, caps, infos, context_tokens)
    answer = answer_placement(
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
        kv_cache_bytes=_kv_sizes(found, infos, context_tokens),
        fit_checked={c.node for c in found.qualifying if found.configs[c.node] in caps},
    )
    # Serialized here: FastAPI would dump and validate the answer again, which costs more
    # than the query on a 1,000-node fleet.
    return Response(answer.model_dump_json(), media_type="application/json")


def _kv_sizes(
    found: latest.PlacementRows,
    infos: Mapping[int, ModelInfo],
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
            memory = latest.memory_of(config, infos[config.model_id])
            sizes[key] = memory.kv_bytes(concurrency=choice.b, tokens_per_user=tokens)
        found_sizes[choice.node] = sizes[key]
    return found_sizes


def _rejected(
    uncapped: latest.PlacementRows,
    caps: Mapping[FitConfig, int],
    infos: Mapping[int, ModelInfo],
    context_tokens: int,
) -> list[RejectedConcurrency]:
    """The concurrencies that met the speed but whose KV cache would not fit."""
    refused = []
    for choice in uncapped.qualifying:
        config = uncapped.configs[choice.node]
        cap = caps.get(config)
        if cap is None or choice.b <= cap:
            continue
        memory = latest.memory_of(config, infos[config.model_id])
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
