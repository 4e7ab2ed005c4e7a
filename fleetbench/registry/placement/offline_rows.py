"""The rows placement reads from the fleet's latest curves (registry.projections.latest): per model,
each node's latest run's points that meet the asked speed, capped where memory caps users,
chosen and ranked in SQL so an answer over 1,000 nodes reads only the rows it returns; and
the facts its answer needs (fit configs, model facts, the longest prompt measured)."""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Double,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    cast,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from fleetbench.registry.model_facts import FleetFacts
from fleetbench.registry.models import (
    DetectableChange,
    EngineBuild,
    LatestPoint,
    LatestRun,
    Node,
    Run,
)
from fleetbench.registry.placement.rules import NodeChoice, NodeMemory
from fleetbench.registry.placement.serving_rows import served_nodes

__all__ = [
    "FitConfig",
    "PlacementRows",
    "fit_configs",
    "longest_prompt",
    "memory_of",
    "placement_rows",
]


@dataclass(frozen=True)
class FitConfig:
    """What a KV-cache fit depends on besides the users: nodes alike share one answer."""

    model_id: int
    facts_id: int | None  # the model's facts as the node reported them (None: it did not)
    memory_bytes: int | None
    cache_type_k: str | None
    cache_type_v: str | None
    n_ubatch: int | None
    beside_kv_bytes: int | None  # weights, compute and outputs as allocated (None: not logged)
    build_id: int  # the llama.cpp build: its rules size the cache
    flash_attn: str | None
    swa_full: bool | None
    build_number: int | None = None  # the build's (one per build_id)


# What a fit config holds of a node's latest run (heads), in FitConfig's order.
_FIT_COLUMNS = (
    "model_id",
    "facts_id",
    "memory_bytes",
    "cache_type_k",
    "cache_type_v",
    "n_ubatch",
    "beside_kv_bytes",
    "build_id",
    "flash_attn",
    "swa_full",
)


def _fit_config(row: Any) -> FitConfig:
    """The fit config of a row holding _FIT_COLUMNS and build_number."""
    values = row._mapping
    fields = {name: values[name] for name in _FIT_COLUMNS}
    return FitConfig(**fields, build_number=values["build_number"])


class PlacementRows(NamedTuple):
    """What a placement answer is made from (see registry.placement.rules)."""

    qualifying: list[NodeChoice]  # the first `limit`, best total S_TG first
    qualifying_count: int
    fastest: NodeChoice | None  # when no node qualifies: the best per-user speed on offer
    longest_prompt: tuple[str, int] | None  # when no node has a point at prompt_tokens
    configs: dict[str, FitConfig]  # of the nodes listed (qualifying or fastest)


@dataclass(frozen=True)
class _Shape:
    """What varies a placement statement's form (the values are bound parameters)."""

    several_models: bool  # a name covering several model files
    since: bool
    prompt: bool
    unserved: bool = False  # only nodes without a serving run that counts


def _shape(
    model_ids: Sequence[int], since: datetime | None, prompt: int | None, unserved: bool = False
) -> _Shape:
    return _Shape(len(model_ids) > 1, since is not None, prompt is not None, unserved)


def _params(model_ids: Sequence[int], since: datetime | None, **more: Any) -> dict[str, Any]:
    return {"model_ids": list(model_ids), "since": since, **more}


def _heads(shape: _Shape) -> Any:
    """Each node's latest run of any of the `model_ids` parameter (newest across them, when
    a name covers several model files), as a subquery."""
    conditions: list[ColumnElement[bool]] = [
        LatestRun.model_id.in_(bindparam("model_ids", expanding=True))
    ]
    if shape.since:
        conditions.append(LatestRun.started_at >= bindparam("since"))
    columns = [
        LatestRun.node_id,
        LatestRun.model_id,
        LatestRun.run_id,
        LatestRun.started_at,
        LatestRun.build_id,
        LatestRun.facts_id,
        LatestRun.memory_bytes,
        LatestRun.cache_type_k,
        LatestRun.cache_type_v,
        LatestRun.n_ubatch,
        LatestRun.beside_kv_bytes,
        LatestRun.flash_attn,
        LatestRun.swa_full,
        LatestRun.engine_on_accelerator,
    ]
    if not shape.several_models:
        return select(*columns).where(*conditions).subquery("heads")
    newest = (
        func.row_number()
        .over(
            partition_by=LatestRun.node_id,
            order_by=(
                LatestRun.started_at.desc(),
                LatestRun.received_at.desc(),
                LatestRun.run_id,
            ),
        )
        .label("newest")
    )
    ranked = select(*columns, newest).where(*conditions).subquery("ranked_heads")
    return select(*(ranked.c[c.key] for c in columns)).where(ranked.c.newest == 1).subquery("heads")


def _cap_expression(heads: Any, caps: Mapping[FitConfig, int]) -> ColumnElement[Any]:
    """The most users of each node that fit (NULL: not capped), from its fit config."""
    whens = [
        (and_(*(_same(heads.c[name], getattr(config, name)) for name in _FIT_COLUMNS)), cap)
        for config, cap in caps.items()
    ]
    return case(*whens, else_=None)


def _same(column: Any, value: object) -> ColumnElement[bool]:
    return typing.cast(ColumnElement[bool], column.is_(None) if value is None else column == value)


@functools.cache
def _uncapped_statement(shape: _Shape) -> Select[*tuple[Any, ...]]:
    # Built once per shape: constructing it costs more than running it.
    return _placement_statement(shape, None)


def _placement_statement(
    shape: _Shape, caps: Mapping[FitConfig, int] | None
) -> Select[*tuple[Any, ...]]:
    heads = _heads(shape)
    point, detectable = LatestPoint, DetectableChange
    conditions: list[ColumnElement[bool]] = [point.s_tg.is_not(None)]
    if shape.prompt:
        conditions.append(point.pp >= bindparam("prompt_tokens"))
    if shape.unserved:  # placement answers for those from their serving runs
        conditions.append(
            point.node_id.not_in(served_nodes(since=shape.since, prompt=shape.prompt))
        )
    source = (
        select(
            point.node_id,
            point.pp,
            point.tg,
            point.b,
            point.s_pp,
            point.s_tg,
            point.mbu,
            point.joules,
            point.past_knee,
            detectable.change.label("min_detectable_change"),
            heads.c.run_id,
            heads.c.started_at,
            heads.c.engine_on_accelerator,
            *(heads.c[name] for name in _FIT_COLUMNS),
        )
        .select_from(point)
        .join(heads, and_(heads.c.node_id == point.node_id, heads.c.model_id == point.model_id))
        .outerjoin(
            detectable,
            and_(
                detectable.node_id == point.node_id,
                detectable.model_id == point.model_id,
                detectable.pp == point.pp,
                detectable.tg == point.tg,
                detectable.b == point.b,
            ),
        )
    )
    if caps:
        cap = _cap_expression(heads, caps)
        conditions.append(or_(cap.is_(None), point.b <= cap))
    if shape.prompt:
        source = source.add_columns(
            func.min(point.pp).over(partition_by=point.node_id).label("shortest")
        )
    eligible = source.where(*conditions).subquery("eligible")
    at_prompt = [eligible.c.pp == eligible.c.shortest] if shape.prompt else []
    min_tps = bindparam("min_tps", type_=Double)
    meets = case((eligible.c.s_tg >= min_tps * eligible.c.b, 1), else_=0)
    merit = case((meets == 1, eligible.c.s_tg), else_=eligible.c.s_tg / cast(eligible.c.b, Double))
    choice = (
        func.row_number()
        .over(
            partition_by=eligible.c.node_id,
            order_by=(
                meets.desc(),
                case((meets == 1, eligible.c.b), else_=0).desc(),
                merit.desc(),
                eligible.c.pp,
                eligible.c.tg,
            ),
        )
        .label("choice")
    )
    chosen = (
        select(eligible, meets.label("meets"), merit.label("merit"), choice)
        .where(*at_prompt)
        .subquery("chosen")
    )
    return (
        select(
            Node.name,
            chosen.c.run_id,
            chosen.c.started_at,
            EngineBuild.build_number,
            chosen.c.pp,
            chosen.c.tg,
            chosen.c.b,
            chosen.c.s_pp,
            chosen.c.s_tg,
            chosen.c.mbu,
            chosen.c.joules,
            Run.energy,
            chosen.c.past_knee,
            chosen.c.min_detectable_change,
            chosen.c.engine_on_accelerator,
            *(chosen.c[name] for name in _FIT_COLUMNS),
            func.sum(chosen.c.meets).over().label("qualifying"),
        )
        .select_from(chosen)
        .join(Node, Node.id == chosen.c.node_id)
        .join(EngineBuild, EngineBuild.id == chosen.c.build_id)
        .join(Run, Run.id == chosen.c.run_id)
        .where(chosen.c.choice == 1)
        .order_by(chosen.c.meets.desc(), chosen.c.merit.desc(), chosen.c.s_tg.desc(), Node.name)
        .limit(bindparam("limit", type_=Integer))
    )


def placement_rows(
    session: Session,
    *,
    model_ids: Sequence[int],
    since: datetime | None,
    prompt_tokens: int | None,
    min_tps_per_user: float,
    limit: int,
    caps: Mapping[FitConfig, int] | None = None,
    unserved: bool = False,
) -> PlacementRows:
    """Each node's choice from its latest successful run, at the smallest PP >= prompt_tokens
    when that is given: the largest B whose S_TG / B meets `min_tps_per_user` (ties: higher
    S_TG) or, where none does, the node's fastest point per user. Nodes that qualify come
    first, best total S_TG first; the others after them, fastest per user first. `caps`:
    the most users that fit, by fit config (nodes of other configs are not capped);
    `unserved`: only nodes without a serving run of the model (since, at that prompt).

    One query over the latest tables: windows choose each node's point and count those
    that qualify."""
    shape = _shape(model_ids, since, prompt_tokens, unserved)
    statement = _placement_statement(shape, caps) if caps else _uncapped_statement(shape)
    params = _params(
        model_ids, since, prompt_tokens=prompt_tokens, min_tps=min_tps_per_user, limit=limit
    )
    rows = session.connection().execute(statement, params).all()
    choices = []
    configs = {}
    for row in rows:
        choices.append(
            NodeChoice(
                node=row.name,
                run_id=row.run_id,
                measured_at=row.started_at,
                llama_cpp_build=row.build_number,
                pp=row.pp,
                tg=row.tg,
                b=row.b,
                s_pp=row.s_pp,
                s_tg=row.s_tg,  # the query keeps only points with an S_TG
                past_knee=row.past_knee,
                mbu=row.mbu,
                joules=row.joules,
                energy_source=row.energy.get("source") if row.energy else None,
                engine_on_accelerator=row.engine_on_accelerator,
                min_detectable_change=row.min_detectable_change,
            )
        )
        configs[row.name] = _fit_config(row)
    count = int(rows[0].qualifying) if rows else 0
    if count:
        return PlacementRows(choices[:count], count, None, None, configs)
    if choices or prompt_tokens is None:
        return PlacementRows([], 0, choices[0] if choices else None, None, configs)
    longest = longest_prompt(session, model_ids=model_ids, since=since)
    return PlacementRows([], 0, None, longest, configs)


@functools.cache
def _longest_prompt_statement(shape: _Shape) -> Select[*tuple[Any, ...]]:
    heads = _heads(shape)
    return (
        select(Node.name, LatestPoint.pp)
        .select_from(LatestPoint)
        .join(
            heads,
            and_(heads.c.node_id == LatestPoint.node_id, heads.c.model_id == LatestPoint.model_id),
        )
        .join(Node, Node.id == LatestPoint.node_id)
        .order_by(LatestPoint.pp.desc(), Node.name)
        .limit(1)
    )


def longest_prompt(
    session: Session, *, model_ids: Sequence[int], since: datetime | None
) -> tuple[str, int] | None:
    """(node, PP) of the longest prompt in the nodes' latest successful runs."""
    statement = _longest_prompt_statement(_shape(model_ids, since, None))
    row = session.connection().execute(statement, _params(model_ids, since)).first()
    return (row[0], row[1]) if row is not None else None


@functools.cache
def _fit_config_statement(shape: _Shape) -> Select[*tuple[Any, ...]]:
    heads = _heads(shape)
    keys = (*(heads.c[name] for name in _FIT_COLUMNS), EngineBuild.build_number)
    return (
        select(*keys, func.count().label("nodes"), func.min(Node.name).label("first"))
        .select_from(heads)
        .join(Node, Node.id == heads.c.node_id)
        .join(EngineBuild, EngineBuild.id == heads.c.build_id)
        .group_by(*keys)
    )


def memory_of(config: FitConfig, facts: FleetFacts, *, node: str = "") -> NodeMemory:
    return NodeMemory(
        node=node,
        memory_bytes=config.memory_bytes,
        model=facts.of(config.model_id, config.facts_id).info,
        cache_type_k=config.cache_type_k,
        cache_type_v=config.cache_type_v,
        n_ubatch=config.n_ubatch,
        beside_kv_bytes=config.beside_kv_bytes,
        build=config.build_number,
        flash_attn=config.flash_attn,
        swa_full=config.swa_full,
    )


def fit_configs(
    session: Session, *, model_ids: Sequence[int], since: datetime | None
) -> list[tuple[FitConfig, int, str]]:
    """The distinct fit configs among the nodes' latest runs: (config, how many nodes, the
    first node's name)."""
    statement = _fit_config_statement(_shape(model_ids, since, None))
    rows = session.connection().execute(statement, _params(model_ids, since))
    return [(_fit_config(row), row.nodes, row.first) for row in rows]
