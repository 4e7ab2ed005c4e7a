from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Response
from sqlalchemy.orm import Session

from agent.wire import PlacementAnswer, RejectedConcurrency
from registry import crud
from registry.deps import ReadAccess, SessionDep, models_or_404
from registry.questions.knee import find_knee
from registry.questions.placement import (
    GIB,
    NodeChoice,
    NodeMemory,
    answer_placement,
    largest_fitting_concurrency,
    why_fit_unchecked,
)

router = APIRouter(tags=["questions"], dependencies=[ReadAccess])


@router.get("/placement", response_model=PlacementAnswer, responses={404: {}})
def read_placement(
    session: SessionDep,
    model: Annotated[str, Query(min_length=1, description="display name or GGUF sha256")],
    min_tps_per_user: Annotated[float, Query(ge=0, allow_inf_nan=False)],
    prompt_tokens: Annotated[int | None, Query(ge=0)] = None,
    context_tokens: Annotated[
        int | None,
        Query(ge=1, le=2**31 - 1, description="tokens each user's conversation holds"),
    ] = None,
    max_age_days: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
    limit: Annotated[
        int, Query(ge=1, le=100_000, description="list at most this many candidates")
    ] = 100,
) -> Response:
    """Which node and concurrency meets `min_tps_per_user` decode tokens/s per user and,
    given `context_tokens`, holds every user's KV cache beside the weights?"""
    models = models_or_404(session, model)
    model_ids = [m.id for m in models]
    since = datetime.now(UTC) - timedelta(days=max_age_days) if max_age_days else None

    def rows(caps: dict[str, int] | None = None) -> crud.PlacementRows:
        return crud.placement_rows(
            session,
            model_ids=model_ids,
            since=since,
            prompt_tokens=prompt_tokens,
            min_tps_per_user=min_tps_per_user,
            limit=limit,
            max_concurrency=caps,
        )

    rejected: list[RejectedConcurrency] = []
    unchecked: list[tuple[str, str]] = []
    caps: dict[str, int] = {}  # the most users that fit, by node (fit checked)
    if context_tokens is None:
        found = rows()
        listed = [c.run_id for c in found.qualifying]
        memories = {m.node: m for m in crud.node_memories(session, run_ids=listed)}
    else:
        memories = {
            m.node: m for m in crud.node_memories(session, model_ids=model_ids, since=since)
        }
        # Nodes alike (hardware, model, cache settings) share one answer.
        fitting = functools.cache(
            lambda m: largest_fitting_concurrency(m, tokens_per_user=context_tokens)
        )
        for node, memory in memories.items():
            if (why := why_fit_unchecked(memory)) is not None:
                unchecked.append((node, why))
            else:
                caps[node] = fitting(dataclasses.replace(memory, node=""))
        uncapped = rows()
        found = rows(caps) if caps else uncapped
        rejected = _rejected(uncapped.qualifying, caps, memories, context_tokens)
    answer = answer_placement(
        model=models[0].name,
        min_tps_per_user=min_tps_per_user,
        qualifying=_with_knee_and_fit(session, found.qualifying, memories, context_tokens, caps),
        qualifying_count=found.qualifying_count,
        fastest=found.fastest,
        prompt_tokens=prompt_tokens,
        longest_prompt=found.longest_prompt,
        max_age_days=max_age_days,
        context_tokens=context_tokens,
        rejected=rejected,
        unchecked=unchecked,
    )
    # Serialized here: FastAPI would dump and validate the answer again, which costs more
    # than the query on a 1,000-node fleet.
    return Response(answer.model_dump_json(), media_type="application/json")


def _with_knee_and_fit(
    session: Session,
    choices: list[NodeChoice],
    memories: dict[str, NodeMemory],
    context_tokens: int | None,
    caps: dict[str, int],
) -> list[NodeChoice]:
    """The choices with the knee of their curve, their users' KV cache size and whether
    their fit was checked (their node has a cap)."""
    curves = crud.curve_points(session, run_ids=[c.run_id for c in choices])
    enriched = []
    for choice in choices:
        memory = memories.get(choice.node)
        tokens = context_tokens or choice.pp + choice.tg
        enriched.append(
            dataclasses.replace(
                choice,
                knee=find_knee(curves.get((choice.run_id, choice.pp, choice.tg), [])),
                kv_cache_bytes=(
                    memory.kv_bytes(concurrency=choice.b, tokens_per_user=tokens)
                    if memory is not None
                    else None
                ),
                fit_checked=choice.node in caps,
            )
        )
    return enriched


def _rejected(
    uncapped: list[NodeChoice],
    caps: dict[str, int],
    memories: dict[str, NodeMemory],
    context_tokens: int,
) -> list[RejectedConcurrency]:
    """The concurrencies that met the speed but whose KV cache would not fit."""
    refused = []
    for choice in uncapped:
        cap = caps.get(choice.node)
        if cap is None or choice.b <= cap:
            continue
        memory = memories[choice.node]
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
