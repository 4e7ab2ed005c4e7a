"""Old runs: `fleetbench-registry prune` keeps every run for the retention period, then only
what the registry still needs, while it serves."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from fleetbench.registry import crud, retention, tokens
from fleetbench.registry.db import (
    session_factory,
)
from fleetbench.registry.models import (
    NodeActivity,
    Regression,
    Run,
    RunPoint,
)
from tests.factories import WOBBLE, make_report, scaled, store_report

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
