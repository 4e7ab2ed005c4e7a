"""Every projection of the runs (registry.projections) equals its rebuild from the runs
alone, after any sequence of reports (several nodes, models, builds, settings and
hardware; failed and serving runs; retries and copies within a batch) and prunes: on
SQLite and PostgreSQL. Hypothesis shrinks a failure to the shortest sequence."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, Table, delete, or_, select
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.contract import wire
from fleetbench.registry import crud, tokens
from fleetbench.registry.db import create_db_engine, session_factory, write_transaction
from fleetbench.registry.ingest import Stored, ingest_batch
from fleetbench.registry.models import (
    RUN_SERVED,
    RUN_SUCCESSFUL,
    Base,
    BuildSumsStamp,
    LatestRun,
    NodeActivity,
    Run,
    SeriesCheck,
)
from fleetbench.registry.projections import PROJECTIONS, REBUILT
from fleetbench.registry.projections.activity import hold_nodes
from fleetbench.registry.projections.latest import LATEST
from fleetbench.registry.projections.rebuild import rebuild
from fleetbench.registry.retention import prune_runs
from tests.factories import DAY0, command, make_report, make_serving_report
from tests.registry.test_compare import gpu

NODES = ("n0", "n1", "n2")
MODELS = ("model-a", "model-b")
RUN_IDS = uuid.UUID("6b0d7f32-0000-4000-8000-000000000000")  # names the runs of a sequence


@dataclass(frozen=True)
class Report:
    node: int
    model: int
    build: int
    serving: bool
    failed: bool
    settings: int
    hour: int
    hardware: int  # 0: none; 1, 2: two drivers of one GPU
    speed: float
    # offline: 0 plain points, 1 measured 3 times with a spread, 2 one point without S_TG,
    # 3 partial (a point failed); serving: 2 and 3 longer prompts
    shape: int

    def made(self, run_id: uuid.UUID) -> wire.RunReport:
        node = NODES[self.node]
        fields: dict[str, Any] = {
            "run_id": run_id,
            "node": node,
            "model": MODELS[self.model],
            "started_at": DAY0 + timedelta(hours=self.hour),
            "hardware": gpu("NVIDIA H100 80GB HBM3", node, f"55{self.hardware}")
            if self.hardware
            else None,
        }
        if self.failed:
            fields |= {"status": "failed", "error": "out of memory"}
        if self.serving:
            return make_serving_report(
                points=[]
                if self.failed
                else [
                    (1, 30 * self.speed, 28 * self.speed, 90.0),
                    (4, 80 * self.speed, 18 * self.speed, 140.0),
                ],
                build_number=7100 + self.build,
                slots=4 + self.settings,
                prompt_tokens=512 if self.shape < 2 else 1024,
                **fields,
            )
        if self.shape == 3 and not self.failed:
            fields |= {
                "status": "partial",
                "failures": [wire.FailedPoint(pp=512, tg=128, b=8, reason="out of memory")],
            }
        return make_report(
            build_number=11429 + self.build,
            settings=wire.RunSettings(
                n_ctx=2048 * (1 + self.settings), kv_unified=self.settings == 1
            ),
            points=[] if self.failed else self._points(),
            **fields,
        )

    def _points(self) -> list[wire.Point]:
        points = []
        for b, s_pp, s_tg in ((1, 300.0, 28.3), (2, 320.0, 50.0), (4, 330.0, 60.0)):
            figures: dict[str, Any] = {"s_pp": s_pp, "s_tg": s_tg * self.speed}
            if self.shape == 1:
                figures |= {"repeats": 3, "s_pp_stdev": 3.0, "s_tg_stdev": 0.02 * s_tg}
            if self.shape == 2 and b == 4:
                figures["s_tg"] = None
            points.append(wire.Point(pp=512, tg=128, b=b, **figures))
        return points


@dataclass(frozen=True)
class Batch:
    reports: tuple[Report, ...]
    copies: tuple[int, ...]  # earlier reports sent again (retries), by position


@dataclass(frozen=True)
class Prune:
    hour: int


reports = st.builds(
    Report,
    node=st.integers(0, len(NODES) - 1),
    model=st.integers(0, len(MODELS) - 1),
    build=st.integers(0, 2),
    serving=st.booleans(),
    failed=st.booleans(),
    settings=st.integers(0, 1),
    hour=st.integers(0, 12),
    hardware=st.integers(0, 2),
    speed=st.sampled_from([0.5, 1.0, 1.0, 1.25]),
    shape=st.integers(0, 3),
)
steps = st.lists(
    st.one_of(
        st.builds(
            Batch,
            reports=st.lists(reports, min_size=1, max_size=3).map(tuple),
            copies=st.lists(st.integers(0, 50), max_size=2).map(tuple),
        ),
        st.builds(Prune, hour=st.integers(0, 14)),
    ),
    min_size=1,
    max_size=10,
)


def _key_only(table: Table) -> bool:
    """A table whose other columns count its writes (a stamp's version and time): its rows,
    not those columns, are the projection of the runs."""
    return table.name == BuildSumsStamp.__tablename__


def snapshot(session: Session) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of every projection a rebuild makes, sorted; floats rounded to 9
    significant digits (sums added in another order differ in the last bits)."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    for projection in REBUILT:
        for table in projection.tables:
            columns = table.primary_key.columns if _key_only(table) else table.columns
            rows = session.execute(select(*columns)).all()
            found[table.name] = sorted(
                (tuple(_rounded(value) for value in row) for row in rows), key=repr
            )
    return found


def _rounded(value: Any) -> Any:
    if isinstance(value, float) and value != 0 and math.isfinite(value):
        return float(f"{value:.9g}")
    return value


def _clear(engine: Engine) -> None:
    with engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):
            connection.execute(delete(table))


def node_ids(sessions: sessionmaker[Session]) -> list[int]:
    with sessions() as session, write_transaction(session):
        ids = []
        for name in NODES:
            tokens.create_node_token(session, node_name=name, labels={})
            found = crud.find_node(session, name)
            assert found is not None
            ids.append(found.id)
        session.commit()
    return ids


def play(sessions: sessionmaker[Session], sequence: Sequence[Batch | Prune]) -> None:
    ids = node_ids(sessions)
    sent: list[wire.RunReport] = []
    for position, step in enumerate(sequence):
        if isinstance(step, Prune):
            prune_runs(sessions, cutoff=DAY0 + timedelta(hours=step.hour), batch=2)
            continue
        made = [
            report.made(uuid.UUID(int=RUN_IDS.int + 16 * position + i))
            for i, report in enumerate(step.reports)
        ]
        again = [sent[i % len(sent)] for i in step.copies if sent]
        batch = [*made, *again, *made[:1]]  # a copy within the batch too
        with sessions() as session, write_transaction(session):
            answers = ingest_batch(
                session, [(report, ids[NODES.index(report.node)]) for report in batch]
            )
            session.commit()
        assert all(isinstance(answer, Stored) for answer in answers), answers
        sent += made


def registry_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return command(
        sys.executable, "-m", "fleetbench.registry.cli", *args, FLEETBENCH_DATABASE_URL=database_url
    )


SERIES_WITH_RUNS = (
    select(Run.node_id, Run.model_id, Run.kind)
    .where(or_(RUN_SUCCESSFUL, RUN_SERVED))
    .group_by(Run.node_id, Run.model_id, Run.kind)
)


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,  # the same sequences in every run of the suite
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
def test_every_projection_equals_its_rebuild_after_any_reports_and_prunes(
    engine: Engine, sessions: sessionmaker[Session], sequence: list[Batch | Prune]
) -> None:
    _clear(engine)
    play(sessions, sequence)
    with sessions() as session:
        kept = snapshot(session)
        # the judge's queue (work, not state: no rebuild) names every series with a run
        # that counts, no judge having run
        queued = set(session.execute(select(*SeriesCheck.__table__.primary_key.columns)))
        assert queued == set(session.execute(SERIES_WITH_RUNS))
    rebuild(sessions, REBUILT, batch=2)
    with sessions() as session:
        assert snapshot(session) == kept


def test_the_rebuild_command_makes_what_was_lost_again(
    database_url: str, sessions: sessionmaker[Session]
) -> None:
    play(
        sessions,
        [
            Batch((Report(0, 0, 0, False, False, 0, 1, 1, 1.0, 0),), ()),
            Batch((Report(0, 0, 1, False, False, 0, 2, 1, 0.5, 1),), ()),
            Batch((Report(1, 1, 0, True, False, 1, 3, 2, 1.0, 0),), ()),
        ],
    )
    with sessions() as session:
        kept = snapshot(session)
    with sessions() as session, write_transaction(session):
        session.execute(delete(LatestRun))
        session.execute(NodeActivity.__table__.update().values(run_count=99))
        session.commit()
    with sessions() as session:
        assert snapshot(session) != kept
    done = registry_cli(database_url, "rebuild", "--projection", "latest")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rebuilt latest for 3 nodes"
    with sessions() as session:
        partly = snapshot(session)
    assert partly["latest_runs"] == kept["latest_runs"]
    assert {row[-1] for row in partly["node_activity"]} == {99}  # only the one asked for
    done = registry_cli(database_url, "rebuild")
    assert done.returncode == 0, done.stderr
    assert "3 of 3 nodes rebuilt" in done.stderr
    with sessions() as session:
        assert snapshot(session) == kept


def test_the_rebuild_command_names_the_projections_it_knows(database_url: str) -> None:
    done = registry_cli(database_url, "rebuild", "--projection", "nope")
    assert done.returncode == 2
    assert (
        "no projection named 'nope' to rebuild: there are activity, latest, latest_serving, sums"
        in (" ".join(done.stderr.split()))
    )


def test_a_projection_step_left_out_is_caught(
    engine: Engine, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above tells: ingest without the latest curves' step differs from
    the rebuild."""
    without = tuple(p for p in PROJECTIONS if p is not LATEST)
    monkeypatch.setattr("fleetbench.registry.ingest.batch.PROJECTIONS", without)
    play(sessions, [Batch((Report(0, 0, 0, False, False, 0, 1, 1, 1.0, 0),), ())])
    with sessions() as session:
        kept = snapshot(session)
    rebuild(sessions, REBUILT)
    with sessions() as session:
        assert snapshot(session)["latest_runs"] != kept["latest_runs"] == []


def test_a_nodes_first_run_waits_for_a_rebuild_of_that_node(postgres_database_url: str) -> None:
    """A node with no runs yet has no activity row to lock: the rebuild makes one to hold,
    so the node's first batch waits for it, then counts itself (PostgreSQL; SQLite has one
    writer)."""
    engine = create_db_engine(postgres_database_url)
    sessions = session_factory(engine)
    [node_id, *_] = node_ids(sessions)
    report = Report(0, 0, 0, False, False, 0, 1, 1, 1.0, 0).made(uuid.uuid4())

    def ingest() -> None:
        with sessions() as session, write_transaction(session):
            ingest_batch(session, [(report, node_id)])
            session.commit()

    writer = threading.Thread(target=ingest)
    with engine.connect() as connection, connection.begin(), hold_nodes(connection, [node_id]):
        writer.start()
        writer.join(timeout=1.0)
        assert writer.is_alive()  # waiting for the rebuild's row
        for projection in REBUILT:
            assert projection.rebuild is not None
            projection.rebuild(connection, [node_id])
    writer.join(timeout=30)
    assert not writer.is_alive()
    with sessions() as session:
        assert session.scalar(select(NodeActivity.run_count)) == 1
        assert session.scalar(select(LatestRun.run_id)) == report.run_id
    engine.dispose()
