"""Old runs: `fleetbench-registry prune` keeps every run for the retention period, then only
what the registry still needs, while it serves; and migration 0004 fills the latest tables
from the runs already stored."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from alembic import command
from sqlalchemy import Engine, Uuid, bindparam, func, select, text
from sqlalchemy.orm import Session

from fleetbench.registry import crud, retention, tokens
from fleetbench.registry.db import (
    alembic_config,
    session_factory,
    upgrade_schema,
    write_transaction,
)
from fleetbench.registry.models import (
    LatestPoint,
    LatestRun,
    Node,
    NodeActivity,
    Regression,
    Run,
    RunPoint,
    UTCDateTime,
)
from fleetbench.registry.projections import latest
from tests.factories import ARTICLE_TABLE, WOBBLE, make_report, scaled, store_report

NOW = datetime.now(UTC)
ROOT = Path(__file__).resolve().parents[2]


def _runs(session: Session) -> set[uuid.UUID]:
    return set(session.scalars(select(Run.id)))


def test_prune_keeps_what_the_registry_needs_and_counts_what_it_deleted(
    engine: Engine,
) -> None:
    sessions = session_factory(engine)
    with sessions() as session:
        tokens.create_node_token(session, node_name="m4pro", labels={})
        node = crud.find_node(session, "m4pro")
        assert node is not None

        def store(days_ago: float, build: int, factor: float = 1.0, **fields: object) -> uuid.UUID:
            report = make_report(
                started_at=NOW - timedelta(days=days_ago),
                build_number=build,
                table=scaled(factor),
                **fields,  # type: ignore[arg-type]
            )
            store_report(session, report, node.id)
            return report.run_id

        # Build 1, long ago: five runs, a step down on the fifth, then build 2 recently.
        old_build_1 = [store(200 - day, 1, WOBBLE[day]) for day in range(4)]
        newest_of_build_1 = store(195, 1, WOBBLE[4])
        old_failed = store(190, 1, status="failed", error="boom", points=[])
        slower = [store(180 - day, 2, 0.8) for day in range(3)]
        recent = [store(5 - day, 2, 0.8) for day in range(3)]
        steps = set(session.scalars(select(Regression.first_run_id)))
        befores = set(session.scalars(select(Regression.before_run_id)))
        assert steps == {slower[0]}  # the build's slowdown, from its first run
        points_before = session.scalar(select(func.count()).select_from(RunPoint))

    dry = retention.prune_runs(sessions, cutoff=NOW - timedelta(days=30), dry_run=True)
    progress: list[int] = []
    pruned = retention.prune_runs(
        sessions,
        cutoff=NOW - timedelta(days=30),
        batch=2,
        progress=lambda p: progress.append(p.runs),
    )

    with sessions() as session:
        kept = _runs(session)
        activity = session.get(NodeActivity, node.id)
        points_after = session.scalar(select(func.count()).select_from(RunPoint))
    assert dry == pruned
    # Kept: the newest successful run of each build before the cutoff (build 1's; build 2's
    # is recent anyway), the runs regressions name, every recent run.
    assert kept == {newest_of_build_1, *recent} | steps | befores
    assert old_failed not in kept and not set(old_build_1[:3]) & kept
    assert pruned.runs == 12 - len(kept)
    assert points_after == points_before - pruned.points
    assert progress and progress[-1] == pruned.runs
    assert activity is not None and activity.run_count == len(kept)


def test_prune_runs_from_the_command_line_and_says_what_it_did(database_url: str) -> None:
    from fleetbench.registry.db import create_db_engine

    engine = create_db_engine(database_url)
    with session_factory(engine)() as session:
        tokens.create_node_token(session, node_name="m4pro", labels={})
        node = crud.find_node(session, "m4pro")
        assert node is not None
        for days_ago in (100, 99, 1):
            report = make_report(started_at=NOW - timedelta(days=days_ago))
            store_report(session, report, node.id)
    engine.dispose()
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": database_url}
    command_line = [sys.executable, "-m", "fleetbench.registry.cli", "prune", "--days", "30"]
    looked = subprocess.run(
        [*command_line, "--dry-run"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    done = subprocess.run(command_line, env=env, cwd=ROOT, capture_output=True, text=True)
    unset = subprocess.run(
        command_line[:-2], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert looked.returncode == 0, looked.stderr
    assert looked.stdout.startswith("would delete 2 runs (12 points)")
    assert done.stdout.startswith("deleted 2 runs (12 points)")
    assert unset.returncode == 2
    assert "FLEETBENCH_RETENTION_DAYS" in unset.stderr
    assert "Traceback" not in unset.stderr


def test_migration_0004_fills_the_latest_tables_from_the_runs_stored(
    empty_database_url: str,
) -> None:
    """A database at 0003 with a history (the newest run of one model failed, an old run
    holding one cell twice) is upgraded: each node's latest successful run per model, its
    points, and the node's newest run and run count; the knees are computed after."""
    from fleetbench.registry.db import create_db_engine

    engine = create_db_engine(empty_database_url)
    command.upgrade(alembic_config(engine), "0003")
    sessions = session_factory(engine)
    day = datetime(2026, 11, 1, tzinfo=UTC)
    with sessions() as session:
        node = Node(name="m4pro", labels={}, created_at=day)
        session.add(node)
        session.flush()
        # SQL naming only the columns 0003 had (the ORM and Core would add today's)
        build_id = session.execute(
            text(
                "INSERT INTO engine_builds (identity, engine, build_number) "
                "VALUES (:identity, 'llama.cpp', 11429) RETURNING id"
            ),
            {"identity": "b" * 64},
        ).scalar_one()
        model_id = session.execute(
            text(
                "INSERT INTO models (identity, name, name_key) "
                "VALUES ('name:nemo', 'nemo', 'nemo') RETURNING id"
            )
        ).scalar_one()
        ids = []
        for hours, status in ((0, "ok"), (1, "ok"), (2, "failed")):
            run_id = uuid.uuid4()
            session.execute(
                text(
                    "INSERT INTO runs (id, node_id, build_id, model_id, source, status, error,"
                    " started_at, received_at, report_sha256) VALUES (:id, :node, :build,"
                    " :model, 'sweep', :status, :error, :at, :at, :digest)"
                ).bindparams(bindparam("id", type_=Uuid()), bindparam("at", type_=UTCDateTime())),
                {
                    "id": run_id,
                    "node": node.id,
                    "build": build_id,
                    "model": model_id,
                    "status": status,
                    "error": "boom" if status == "failed" else None,
                    "at": day + timedelta(hours=hours),
                    "digest": "0" * 64,
                },
            )
            ids.append(run_id)
            if status == "ok":
                table = ARTICLE_TABLE + ARTICLE_TABLE[:1]  # B=1 twice
                session.add_all(
                    RunPoint(
                        run_id=run_id,
                        pp=512,
                        tg=128,
                        b=b,
                        s_pp=s_pp,
                        s_tg=s_tg * (hours + 1),
                        repeats=1,
                    )
                    for b, s_pp, s_tg in table
                )
        session.commit()
    upgrade_schema(engine)
    with sessions() as session:
        head = session.scalars(select(LatestRun)).one()
        points = session.execute(
            select(LatestPoint.b, LatestPoint.s_tg, LatestPoint.past_knee).order_by(LatestPoint.b)
        ).all()
        activity = session.scalars(select(NodeActivity)).one()
        with write_transaction(session):
            filled = latest.fill_unknown_knees(session)
            session.commit()
        knees = dict(session.execute(select(LatestPoint.b, LatestPoint.past_knee)).all())
    engine.dispose()
    assert head.run_id == ids[1]  # the newest successful one
    assert [(b, s) for b, s, _ in points] == [(b, s_tg * 2) for b, _, s_tg in ARTICLE_TABLE]
    assert all(knee is None for _, _, knee in points)  # unknown until computed
    assert (activity.last_run_id, activity.run_count) == (ids[2], 3)
    assert filled == 1
    assert knees == {1: False, 2: False, 4: False, 8: False, 16: True, 32: True}


def test_migrate_computes_the_knees_the_migration_left_unknown(empty_database_url: str) -> None:
    from fleetbench.registry.db import create_db_engine

    engine = create_db_engine(empty_database_url)
    upgrade_schema(engine)
    with session_factory(engine)() as session:
        tokens.create_node_token(session, node_name="m4pro", labels={})
        node = crud.find_node(session, "m4pro")
        assert node is not None
        store_report(session, make_report(), node.id)
        session.execute(text("UPDATE latest_points SET past_knee = NULL"))
        session.commit()
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": empty_database_url}
    done = subprocess.run(
        [sys.executable, "-m", "fleetbench.registry.cli", "migrate"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    with session_factory(engine)() as session:
        past = dict(session.execute(select(LatestPoint.b, LatestPoint.past_knee)).all())
    engine.dispose()
    assert done.returncode == 0, done.stderr
    assert "knees computed for 1 curve(s)" in done.stderr
    assert past[8] is False and past[16] is True
