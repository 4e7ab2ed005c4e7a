"""Keyword-only functions over the registry's tables. Routes and the CLI call these; they
flush but never commit (the caller owns the transaction)."""

from __future__ import annotations

import hashlib
import json
import secrets
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import ColumnElement, Double, and_, case, cast, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased, selectinload

from agent import wire
from registry.history import build_label, refresh_regressions
from registry.models import (
    RUN_NEWEST_FIRST,
    RUN_SUCCESSFUL,
    EngineBuild,
    FailedPoint,
    HardwareFingerprint,
    Model,
    Node,
    NodeToken,
    Regression,
    Run,
    RunPoint,
)
from registry.questions.hardware import summarize_hardware
from registry.questions.placement import NodeChoice, NodeMemory

__all__ = [
    "NodeSummary",
    "PlacementRows",
    "RunConflict",
    "build_identity",
    "create_node_token",
    "curve_points",
    "find_models",
    "find_node",
    "get_node",
    "get_run",
    "ingest_report",
    "list_models",
    "list_nodes",
    "list_runs",
    "model_name_key",
    "node_for_token",
    "node_memories",
    "placement_rows",
]

_Row = TypeVar("_Row")

TOKEN_PREFIX = "fbn_"


class RunConflict(Exception):
    """A run with this id exists and its report differs from the one sent now."""


class NodeSummary(NamedTuple):
    node: Node
    last_run_at: datetime | None
    runs: int
    last_status: str | None  # of the latest run
    engine: str | None  # the latest run's engine build
    hardware: str | None  # the latest run's fingerprint, described
    open_regressions: int  # not acknowledged, and no later step in their series


def _now() -> datetime:
    return datetime.now(UTC)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def model_name_key(name: str) -> str:
    """How model names compare: case-insensitive, with or without `.gguf`."""
    return name.strip().lower().removesuffix(".gguf")


# --- nodes and tokens ------------------------------------------------------------------


def find_node(session: Session, name: str) -> Node | None:
    return session.scalars(select(Node).where(Node.name == name)).one_or_none()


def create_node_token(session: Session, *, node_name: str, labels: dict[str, str]) -> str:
    """A new token for the node (created if needed); returns the token, stored only hashed."""
    node = find_node(session, node_name)
    if node is None:
        node = Node(name=node_name, labels=labels, created_at=_now())
        session.add(node)
    elif labels:
        node.labels = {**node.labels, **labels}
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(NodeToken(node=node, token_sha256=_sha256(token), created_at=_now()))
    session.flush()
    return token


def node_for_token(session: Session, token: str) -> Node | None:
    statement = (
        select(Node)
        .join(NodeToken, NodeToken.node_id == Node.id)
        .where(NodeToken.token_sha256 == _sha256(token))
    )
    return session.scalars(statement).one_or_none()


def _node_summaries(session: Session, *conditions: ColumnElement[bool]) -> list[NodeSummary]:
    latest = aliased(Run)
    latest_id = (
        select(Run.id)
        .where(Run.node_id == Node.id)
        .order_by(*RUN_NEWEST_FIRST)
        .limit(1)
        .correlate(Node)
        .scalar_subquery()
    )
    later = aliased(Regression)
    later_step = (
        select(later.id)
        .where(
            later.node_id == Regression.node_id,
            later.model_id == Regression.model_id,
            later.pp == Regression.pp,
            later.tg == Regression.tg,
            later.b == Regression.b,
            later.metric == Regression.metric,
            later.first_seen_at > Regression.first_seen_at,
        )
        .exists()
    )
    # Open: not acknowledged, and still the series' latest step (no later step since).
    open_regressions = (
        select(func.count(Regression.id))
        .where(
            Regression.node_id == Node.id,
            Regression.acknowledged_at.is_(None),
            Regression.change < 0,
            ~later_step,
        )
        .correlate(Node)
        .scalar_subquery()
    )
    # Each node's own runs only (ix_runs_node_started), never an aggregate over all runs.
    run_count = (
        select(func.count(Run.id)).where(Run.node_id == Node.id).correlate(Node).scalar_subquery()
    )
    statement = (
        select(
            Node,
            latest.started_at,
            run_count,
            latest.status,
            EngineBuild,
            HardwareFingerprint.description,
            open_regressions,
        )
        .select_from(Node)
        .outerjoin(latest, latest.id == latest_id)
        .outerjoin(EngineBuild, EngineBuild.id == latest.build_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == latest.fingerprint_id)
        .where(*conditions)
        .order_by(Node.name)
    )
    return [
        NodeSummary(
            node=node,
            last_run_at=last,
            runs=runs or 0,
            last_status=status,
            engine=build_label(build) if build is not None else None,
            hardware=hardware,
            open_regressions=regressions,
        )
        for node, last, runs, status, build, hardware, regressions in session.execute(statement)
    ]


def list_nodes(session: Session) -> list[NodeSummary]:
    """Each node with its latest run's start and its number of runs."""
    return _node_summaries(session)


def get_node(session: Session, name: str) -> tuple[NodeSummary, list[HardwareFingerprint]] | None:
    """One node's summary and the hardware fingerprints it has had, newest first."""
    found = _node_summaries(session, Node.name == name)
    if not found:
        return None
    fingerprints = session.scalars(
        select(HardwareFingerprint)
        .where(HardwareFingerprint.node_id == found[0].node.id)
        .order_by(HardwareFingerprint.last_seen.desc())
    ).all()
    return found[0], list(fingerprints)


# --- ingest ----------------------------------------------------------------------------


def _report_sha256(report: wire.RunReport) -> str:
    return _sha256(report.model_dump_json())


def ingest_report(session: Session, *, report: wire.RunReport, node: Node) -> tuple[Run, bool]:
    """Store the report as a run of `node`. Returns (run, created); a report already stored
    with the same body returns (that run, False). Raises RunConflict for the same run id
    with a different body."""
    digest = _report_sha256(report)
    existing = session.get(Run, report.run_id)
    if existing is not None:
        return _as_retry(existing, digest), False

    settings = report.settings.model_dump()
    run = Run(
        id=report.run_id,
        node=node,
        fingerprint=_fingerprint(session, node=node, report=report),
        build=_build(session, report.engine),
        model=_model(session, report.model),
        source=report.source,
        status=report.status,
        error=report.error,
        started_at=report.started_at,
        finished_at=report.finished_at,
        received_at=_now(),
        report_sha256=digest,
        **settings,
    )
    run.points = [RunPoint(**p.model_dump()) for p in report.points]
    run.failures = [FailedPoint(**f.model_dump()) for f in report.failures]
    try:
        with session.begin_nested():
            session.add(run)
    except IntegrityError:
        # The same run id arrived concurrently and was stored first: answer as a retry.
        stored = session.get(Run, report.run_id)
        if stored is None:
            raise
        return _as_retry(stored, digest), False
    if run.status != "failed":
        refresh_regressions(session, run=run)
    return run, True


def _as_retry(stored: Run, digest: str) -> Run:
    if stored.report_sha256 != digest:
        raise RunConflict(f"run {stored.id} exists with a different report")
    return stored


def _get_or_create(session: Session, statement: Any, create: Callable[[], _Row]) -> _Row:
    """The row `statement` finds, or a new one; a concurrent insert of the same row is
    caught in a savepoint and the winner's row returned."""
    row: _Row | None = session.scalars(statement).one_or_none()
    if row is not None:
        return row
    row = create()
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        row = session.scalars(statement).one()
    return row


def build_identity(fields: dict[str, Any]) -> str:
    """An engine build's identity: a digest of all its fields (NULLs included)."""
    return _sha256(json.dumps(fields, sort_keys=True))


def _build(session: Session, engine: wire.EngineBuild) -> EngineBuild:
    fields = engine.model_dump()
    identity = build_identity(fields)
    return _get_or_create(
        session,
        select(EngineBuild).where(EngineBuild.identity == identity),
        lambda: EngineBuild(identity=identity, **fields),
    )


_MODEL_FACTS = (
    "quantization",
    "n_params",
    "file_size",
    "n_layer",
    "n_head_kv",
    "head_dim_k",
    "head_dim_v",
    "n_ctx_train",
    "sliding_window",
    "n_swa_layers",
)


def _model(session: Session, info: wire.ModelInfo) -> Model:
    key = model_name_key(info.name)
    identity = f"sha256:{info.sha256}" if info.sha256 else f"name:{key}"
    model = _get_or_create(
        session,
        select(Model).where(Model.identity == identity),
        lambda: Model(identity=identity, name=info.name, name_key=key, sha256=info.sha256),
    )
    # Facts a later report knows and an earlier one did not are filled in, never overwritten.
    for fact in _MODEL_FACTS:
        if getattr(model, fact) is None and getattr(info, fact) is not None:
            setattr(model, fact, getattr(info, fact))
    return model


def _fingerprint(
    session: Session, *, node: Node, report: wire.RunReport
) -> HardwareFingerprint | None:
    if report.hardware is None:
        return None
    seen = report.started_at
    hardware = report.hardware
    summary = summarize_hardware(hardware.data)
    fingerprint = _get_or_create(
        session,
        select(HardwareFingerprint).where(
            HardwareFingerprint.node_id == node.id, HardwareFingerprint.hash == hardware.hash
        ),
        lambda: HardwareFingerprint(
            node_id=node.id,
            hash=hardware.hash,
            data=hardware.data,
            first_seen=seen,
            last_seen=seen,
            description=summary.description,
            memory_bytes=summary.memory_bytes,
            memory_kind=summary.memory_kind,
        ),
    )
    if fingerprint.description is None:  # stored before summaries existed (migration 0003)
        fingerprint.description = summary.description
        fingerprint.memory_bytes = summary.memory_bytes
        fingerprint.memory_kind = summary.memory_kind
    fingerprint.first_seen = min(fingerprint.first_seen, seen)
    fingerprint.last_seen = max(fingerprint.last_seen, seen)
    return fingerprint


# --- reads -----------------------------------------------------------------------------


def list_models(session: Session) -> Sequence[tuple[Model, int, datetime | None]]:
    statement = (
        select(Model, func.count(Run.id), func.max(Run.started_at))
        .outerjoin(Run, Run.model_id == Model.id)
        .group_by(Model.id)
        .order_by(Model.name_key, Model.id)
    )
    return [(model, count, last) for model, count, last in session.execute(statement)]


def find_models(session: Session, model: str) -> Sequence[Model]:
    """Models matching a display name (case-insensitive, with or without `.gguf`) or a sha256."""
    conditions: list[ColumnElement[bool]] = [Model.name_key == model_name_key(model)]
    if len(model) == 64:
        conditions.append(Model.sha256 == model.lower())
    return session.scalars(select(Model).where(or_(*conditions))).all()


def list_runs(
    session: Session,
    *,
    node: str | None,
    model: str | None,
    since: datetime | None,
    limit: int,
    offset: int,
) -> tuple[Sequence[Run], int]:
    """Runs newest first, filtered, with the total count before pagination."""
    conditions: list[ColumnElement[bool]] = []
    if node is not None:
        conditions.append(Run.node.has(Node.name == node))
    if model is not None:
        conditions.append(Run.model_id.in_([m.id for m in find_models(session, model)]))
    if since is not None:
        conditions.append(Run.started_at >= since)
    count = session.scalar(select(func.count(Run.id)).where(*conditions)) or 0
    runs = session.scalars(
        select(Run)
        .where(*conditions)
        .options(selectinload(Run.node), selectinload(Run.model), selectinload(Run.build))
        .order_by(Run.started_at.desc(), Run.id)
        .limit(limit)
        .offset(offset)
    ).all()
    return runs, count


def get_run(session: Session, run_id: uuid.UUID) -> Run | None:
    return session.scalars(
        select(Run)
        .where(Run.id == run_id)
        .options(
            selectinload(Run.node),
            selectinload(Run.model),
            selectinload(Run.build),
            selectinload(Run.fingerprint),
            selectinload(Run.points),
            selectinload(Run.failures),
        )
    ).one_or_none()


def _latest_run_of_node(*, model_ids: Sequence[int], since: datetime | None) -> Any:
    """The id of a node's latest successful run of any of `model_ids`, as a subquery
    correlated with `nodes` (one backward probe of ix_runs_node_model_started per node)."""
    return (
        select(Run.id)
        .where(
            Run.node_id == Node.id,
            Run.model_id.in_(model_ids),
            RUN_SUCCESSFUL,
            *([Run.started_at >= since] if since is not None else []),
        )
        .order_by(*RUN_NEWEST_FIRST)
        .limit(1)
        .correlate(Node)
        .scalar_subquery()
    )


class PlacementRows(NamedTuple):
    """What a placement answer is made from (see registry.questions.placement)."""

    qualifying: list[NodeChoice]  # the first `limit`, best total S_TG first
    qualifying_count: int
    fastest: NodeChoice | None  # when no node qualifies: the best per-user speed on offer
    longest_prompt: tuple[str, int] | None  # when no node has a point at prompt_tokens


def placement_rows(
    session: Session,
    *,
    model_ids: Sequence[int],
    since: datetime | None,
    prompt_tokens: int | None,
    min_tps_per_user: float,
    limit: int,
    max_concurrency: Mapping[str, int] | None = None,
) -> PlacementRows:
    """Each node's choice from its latest successful run, at the smallest PP >= prompt_tokens
    when that is given: the largest B whose S_TG / B meets `min_tps_per_user` (ties: higher
    S_TG) or, where none does, the node's fastest point per user. Nodes that qualify come
    first, best total S_TG first; the others after them, fastest per user first.

    Chosen in SQL, one correlated probe per node and one pass: fetching every point of a
    1,000-node fleet into Python, or asking twice, costs more than placement's latency
    budget (bench/placement_latency.py).

    `max_concurrency` caps B per node name (what fits its memory); nodes not named are
    not capped."""
    latest = _latest_run_of_node(model_ids=model_ids, since=since)
    point = aliased(RunPoint)
    conditions: list[ColumnElement[bool]] = [point.run_id == Run.id, point.s_tg.is_not(None)]
    if max_concurrency:
        cap = case(dict(max_concurrency), value=Node.name, else_=None)
        conditions.append(or_(cap.is_(None), point.b <= cap))
    if prompt_tokens is not None:
        shortest_long_enough = (
            select(func.min(RunPoint.pp))
            .where(
                RunPoint.run_id == Run.id,
                RunPoint.pp >= prompt_tokens,
                RunPoint.s_tg.is_not(None),
            )
            .correlate(Run)
            .scalar_subquery()
        )
        conditions.append(point.pp == shortest_long_enough)
    point_meets = point.s_tg >= min_tps_per_user * point.b
    chosen_point = (
        select(point.id)
        .where(*conditions)
        .order_by(
            case((point_meets, 1), else_=0).desc(),
            case((point_meets, point.b), else_=0).desc(),
            case((point_meets, point.s_tg), else_=point.s_tg / cast(point.b, Double)).desc(),
            point.id,
        )
        .limit(1)
        .correlate(Run, Node)
    ).scalar_subquery()
    meets = case((RunPoint.s_tg >= min_tps_per_user * RunPoint.b, 1), else_=0)
    statement = (
        select(
            Node.name,
            Run.id,
            Run.started_at,
            EngineBuild.build_number,
            RunPoint.pp,
            RunPoint.tg,
            RunPoint.b,
            RunPoint.s_pp,
            RunPoint.s_tg,
            func.sum(meets).over().label("qualifying"),
        )
        .select_from(Node)
        .join(Run, Run.id == latest)
        .join(RunPoint, RunPoint.id == chosen_point)
        .join(EngineBuild, EngineBuild.id == Run.build_id)
        .order_by(
            meets.desc(),
            case(
                (meets == 1, RunPoint.s_tg), else_=RunPoint.s_tg / cast(RunPoint.b, Double)
            ).desc(),
            RunPoint.s_tg.desc(),
            Node.name,
        )
        .limit(limit)
    )
    rows = session.connection().execute(statement).all()
    choices = [
        NodeChoice(
            node=node,
            run_id=run_id,
            measured_at=started_at,
            llama_cpp_build=build_number,
            pp=pp,
            tg=tg,
            b=b,
            s_pp=s_pp,
            s_tg=typing.cast(float, s_tg),  # the query keeps only points with an S_TG
        )
        for node, run_id, started_at, build_number, pp, tg, b, s_pp, s_tg, _ in rows
    ]
    count = int(rows[0].qualifying) if rows else 0
    if count:
        return PlacementRows(choices[:count], count, None, None)
    if choices or prompt_tokens is None:
        return PlacementRows([], 0, choices[0] if choices else None, None)
    return PlacementRows([], 0, None, _longest_prompt(session, model_ids=model_ids, since=since))


def _longest_prompt(
    session: Session, *, model_ids: Sequence[int], since: datetime | None
) -> tuple[str, int] | None:
    """(node, PP) of the longest prompt in the nodes' latest successful runs."""
    latest = _latest_run_of_node(model_ids=model_ids, since=since)
    row = session.execute(
        select(Node.name, RunPoint.pp)
        .select_from(Node)
        .join(RunPoint, RunPoint.run_id == latest)
        .order_by(RunPoint.pp.desc(), Node.name)
        .limit(1)
    ).first()
    return (row[0], row[1]) if row is not None else None


def node_memories(
    session: Session,
    *,
    model_ids: Sequence[int] = (),
    since: datetime | None = None,
    run_ids: Sequence[uuid.UUID] | None = None,
) -> list[NodeMemory]:
    """What checking a KV-cache fit needs, for each node's latest successful run of the
    models or, given `run_ids`, for those runs (one index probe each)."""
    which_run = (
        Run.id.in_(run_ids)
        if run_ids is not None
        else Run.id == _latest_run_of_node(model_ids=model_ids, since=since)
    )
    statement = (
        select(
            Node.name,
            HardwareFingerprint.memory_bytes,
            Model,
            Run.cache_type_k,
            Run.cache_type_v,
            Run.n_ubatch,
        )
        .select_from(Node)
        .join(Run, and_(Run.node_id == Node.id, which_run))
        .join(Model, Model.id == Run.model_id)
        .outerjoin(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
    )
    return [
        NodeMemory(
            node=name,
            memory_bytes=memory,
            model=wire.ModelInfo.model_validate(model, from_attributes=True),
            cache_type_k=cache_k,
            cache_type_v=cache_v,
            n_ubatch=ubatch,
        )
        for name, memory, model, cache_k, cache_v, ubatch in session.execute(statement)
    ]


def curve_points(
    session: Session, *, run_ids: Sequence[uuid.UUID]
) -> dict[tuple[uuid.UUID, int, int], list[tuple[int, float]]]:
    """The (B, S_TG) points of each run's curves, by (run, PP, TG)."""
    curves: dict[tuple[uuid.UUID, int, int], list[tuple[int, float]]] = {}
    rows = session.execute(
        select(RunPoint.run_id, RunPoint.pp, RunPoint.tg, RunPoint.b, RunPoint.s_tg).where(
            RunPoint.run_id.in_(run_ids), RunPoint.s_tg.is_not(None)
        )
    )
    for run_id, pp, tg, b, s_tg in rows:
        curves.setdefault((run_id, pp, tg), []).append((b, typing.cast(float, s_tg)))
    return curves
