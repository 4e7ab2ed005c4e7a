"""A node's batching curves of a model: the latest successful run of each engine build, read
(`latest_curves`) and answered (`curves_answer`, the figures from curves.rules), and
beside them the latest serving run, each concurrency as a share of the engine's throughput
there: the cost of the server's scheduling, HTTP and sampling."""

from __future__ import annotations

import functools
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session, selectinload

from fleetbench.contract import wire
from fleetbench.contract.energy import joules_per_token, tokens_per_joule
from fleetbench.registry.curves.rules import curve_figures
from fleetbench.registry.models import (
    POINT_POSSIBLE,
    RUN_NEWEST_FIRST,
    RUN_SUCCESSFUL,
    EngineBuild,
    LatestServingRun,
    Model,
    Node,
    Run,
    RunPoint,
)
from fleetbench.registry.prices.rules import usd_per_million_tokens
from fleetbench.registry.prices.store import classes_of_runs, prices_of
from fleetbench.registry.regressions import labels, series
from fleetbench.registry.schemas import (
    CurvePointPublic,
    CurvePublic,
    CurvesPublic,
    ServingCurvePointPublic,
    ServingCurvePublic,
)
from fleetbench.registry.state import Bounded

__all__ = ["Curve", "CurveBuild", "CurvePoint", "curves_answer", "latest_curves"]


@dataclass(frozen=True)
class CurveBuild:
    engine: str
    build_number: int | None
    commit: str | None
    backend: str | None
    binding: str | None
    binding_version: str | None


@dataclass(frozen=True)
class CurvePoint:
    b: int
    s_tg: float
    s_pp: float | None
    mbu: float | None
    energy: dict[str, Any] | None  # contract.energy.PointEnergy, as sent


@dataclass(frozen=True)
class Curve:
    """One batching curve: the latest run of one build at one (PP, TG)."""

    run_id: uuid.UUID
    measured_at: datetime
    build: CurveBuild
    pp: int
    tg: int
    points: list[CurvePoint]  # by B
    bandwidth: dict[str, Any] | None  # what its MBU is held against (wire.MemoryBandwidth)
    energy: dict[str, Any] | None  # where its joules come from (contract.energy.RunEnergy)


# The node's newest runs the builds' curves are found among: a build it has not run in as
# many runs is history (GET /v1/series keeps it), and a long history costs nothing more.
RECENT_RUNS = 1000


@functools.cache
def _statements() -> tuple[Select[*tuple[Any, ...]], Select[*tuple[Any, ...]]]:
    """(each build's latest successful run of the node's models among its RECENT_RUNS
    newest, oldest first; the points with an S_TG of the `run_ids`), built once."""
    recent = (
        select(Run.id, Run.build_id, Run.started_at, Run.received_at)
        .where(
            Run.node_id == bindparam("node_id"),
            Run.model_id.in_(bindparam("model_ids", expanding=True)),
            RUN_SUCCESSFUL,
        )
        .order_by(*RUN_NEWEST_FIRST)
        .limit(RECENT_RUNS)
        .subquery("recent")
    )
    newest_first = func.row_number().over(
        partition_by=recent.c.build_id,
        order_by=(recent.c.started_at.desc(), recent.c.received_at.desc(), recent.c.id),
    )
    ranked = select(recent.c.id, newest_first.label("rank")).subquery("ranked")
    runs = (
        select(Run.id, Run.started_at, Run.bandwidth, Run.energy, *series.BUILD_COLUMNS)
        .join(EngineBuild, EngineBuild.id == Run.build_id)
        .where(Run.id.in_(select(ranked.c.id).where(ranked.c.rank == 1)))
        .order_by(Run.started_at, Run.received_at)
    )
    points = select(
        RunPoint.run_id,
        RunPoint.pp,
        RunPoint.tg,
        RunPoint.b,
        RunPoint.s_tg,
        RunPoint.s_pp,
        RunPoint.mbu,
        RunPoint.energy,
    ).where(
        RunPoint.run_id.in_(bindparam("run_ids", expanding=True)),
        RunPoint.s_tg.is_not(None),
        POINT_POSSIBLE,
    )
    return runs, points


def latest_curves(session: Session, *, node_id: int, model_ids: Sequence[int]) -> list[Curve]:
    """For each engine build the node ran the model on in its RECENT_RUNS newest successful
    runs, its latest successful run's curves (one per PP x TG); oldest build first."""
    runs_statement, points_statement = _statements()
    connection = session.connection()
    runs = connection.execute(
        runs_statement, {"node_id": node_id, "model_ids": list(model_ids)}
    ).all()
    groups: dict[uuid.UUID, dict[tuple[int, int], list[CurvePoint]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for run_id, pp, tg, *figures in connection.execute(
        points_statement, {"run_ids": [run.id for run in runs]}
    ).all():
        groups[run_id][(pp, tg)].append(CurvePoint(*figures))
    found: list[Curve] = []
    for run_id, started_at, bandwidth, energy, *build in runs:
        for (pp, tg), points in sorted(groups[run_id].items()):
            found.append(
                Curve(
                    run_id,
                    started_at,
                    CurveBuild(*build),
                    pp,
                    tg,
                    sorted(points, key=lambda p: p.b),
                    bandwidth,
                    energy,
                )
            )
    return found


def curves_answer(
    session: Session,
    node: Node,
    models: Sequence[Model],
    *,
    knee_threshold: float,
    classes: Bounded[uuid.UUID, str],
) -> CurvesPublic:
    """`GET /v1/curves`: the node's curves of the models (files sharing one name count as
    one model), each labelled with its build and its knee, each point with its energy and,
    where its run's hardware class has a price, what a million tokens cost there."""
    curves = []
    found = latest_curves(session, node_id=node.id, model_ids=[m.id for m in models])
    class_of = classes_of_runs(session, {c.run_id for c in found}, classes)
    price_of = prices_of(session, set(class_of.values()))
    for curve in found:
        knee, figures = curve_figures([(p.b, p.s_tg, p.s_pp) for p in curve.points], knee_threshold)
        price = price_of.get(class_of.get(curve.run_id, ""))
        build = curve.build
        curves.append(
            CurvePublic(
                label=labels.build_label(build),
                build_number=build.build_number,
                commit=build.commit,
                backend=build.backend,
                binding_version=labels.binding_label(build),
                run_id=curve.run_id,
                measured_at=curve.measured_at,
                pp=curve.pp,
                tg=curve.tg,
                knee=knee,
                bandwidth=curve.bandwidth,
                energy=curve.energy,
                hardware_class=class_of.get(curve.run_id),
                usd_per_hour=price,
                points=[
                    CurvePointPublic(
                        **vars(f),
                        mbu=p.mbu,
                        tokens_per_joule=tokens_per_joule(p.b, curve.tg, joules),
                        joules_per_token=joules_per_token(p.b, curve.tg, joules),
                        energy_invalid=p.energy.get("invalid") if p.energy else None,
                        usd_per_million_tokens=None
                        if price is None
                        else usd_per_million_tokens(price, p.s_tg),
                    )
                    for f, p in zip(figures, curve.points, strict=True)
                    for joules in [p.energy.get("joules") if p.energy else None]
                ],
            )
        )
    return CurvesPublic(
        node=node.name,
        model=models[0].name,
        knee_threshold=knee_threshold,
        curves=curves,
        serving=_serving_curve(session, node, models, curves, knee_threshold),
    )


def _serving_curve(
    session: Session,
    node: Node,
    models: Sequence[Model],
    curves: Sequence[CurvePublic],
    knee_threshold: float,
) -> ServingCurvePublic | None:
    """The node's latest successful serving run of the models, each concurrency beside the
    engine's S_TG at that B in the newest offline curve of the same PP and TG."""
    latest = (
        select(LatestServingRun.run_id)
        .where(
            LatestServingRun.node_id == node.id,
            LatestServingRun.model_id.in_([m.id for m in models]),
        )
        .order_by(LatestServingRun.started_at.desc(), LatestServingRun.received_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    run = session.scalars(
        select(Run).where(Run.id == latest).options(selectinload(Run.serving_points))
    ).first()
    if run is None or run.server is None:
        return None
    server = wire.ServerIdentity.model_validate(run.server)
    offline = next(
        (c for c in reversed(curves) if (c.pp, c.tg) == (server.prompt_tokens, server.gen_tokens)),
        None,
    )
    engine = {p.b: p.total_tps for p in offline.points} if offline else {}
    measured = [(p.concurrency, p.total_tps, None) for p in run.serving_points if p.total_tps]
    knee, _ = curve_figures(measured, knee_threshold) if measured else (None, [])
    return ServingCurvePublic(
        run_id=run.id,
        measured_at=run.started_at,
        server=server,
        knee=knee,
        offline_run_id=offline.run_id if offline else None,
        points=[
            ServingCurvePointPublic(
                concurrency=p.concurrency,
                total_tps=p.total_tps,
                per_user_tps_p10=p.per_user_tps_p10,
                per_user_tps_p50=p.per_user_tps_p50,
                ttft_ms_p90=p.ttft_ms_p90,
                itl_ms_p50=p.itl_ms_p50,
                of_offline_pct=100 * p.total_tps / engine[p.concurrency]
                if p.total_tps is not None and engine.get(p.concurrency)
                else None,
            )
            for p in run.serving_points
        ],
    )
