"""Every projection of the runs (registry.projections) equals its rebuild from the runs
alone, after any sequence of reports (several nodes, models, builds, settings and
hardware; failed and serving runs; retries and copies within a batch) and prunes: on
SQLite and PostgreSQL. Hypothesis shrinks a failure to the shortest sequence."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, Table, delete, select
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.contract import wire
from fleetbench.registry import crud, tokens
from fleetbench.registry.db import session_factory, write_transaction
from fleetbench.registry.ingest import Stored, ingest_batch
from fleetbench.registry.models import Base, BuildSumsStamp, LatestRun, NodeActivity, SeriesCheck
from fleetbench.registry.projections import PROJECTIONS
from fleetbench.registry.projections.rebuild import rebuild
from fleetbench.registry.retention import prune_runs
from tests.factories import DAY0, command, make_report, make_serving_report
from tests.registry.test_compare import gpu

NODES = ("n0", "n1", "n2")
MODELS = ("model-a", "model-b")


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

    def made(self) -> wire.RunReport:
        node = NODES[self.node]
        started = DAY0 + timedelta(hours=self.hour)
        hardware = (
            gpu("NVIDIA H100 80GB HBM3", node, f"55{self.hardware}") if self.hardware else None
        )
        failed: dict[str, Any] = (
            {"status": "failed", "error": "out of memory"} if self.failed else {}
        )
        if self.serving:
            return make_serving_report(
                node=node,
                model=MODELS[self.model],
                points=[]
                if self.failed
                else [
                    (1, 30 * self.speed, 28 * self.speed, 90.0),
                    (4, 80 * self.speed, 18 * self.speed, 140.0),
                ],
                build_number=7100 + self.build,
                started_at=started,
                slots=4 + self.settings,
                hardware=hardware,
                **failed,
            )
        return make_report(
            node=node,
            model=MODELS[self.model],
            table=[(1, 300.0, 28.3 * self.speed), (2, 320.0, 50.0 * self.speed), (4, 330.0, 60.0)],
            build_number=11429 + self.build,
            started_at=started,
            settings=wire.RunSettings(
                n_ctx=2048 * (1 + self.settings), kv_unified=self.settings == 1
            ),
            hardware=hardware,
            **failed,
            **({"points": []} if self.failed else {}),
        )


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
    """Tables whose other columns count or time their writes (a stamp's version, a check's
    queue times): their rows, not those columns, are the projection of the runs."""
    return table.name in (BuildSumsStamp.__tablename__, SeriesCheck.__tablename__)


def snapshot(session: Session) -> dict[str, list[tuple[Any, ...]]]:
    """Every projection's rows, sorted; floats rounded to 9 significant digits (sums added
    in another order differ in the last bits)."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    for projection in PROJECTIONS:
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
    for step in sequence:
        if isinstance(step, Prune):
            prune_runs(sessions, cutoff=DAY0 + timedelta(hours=step.hour), batch=2)
            continue
        made = [report.made() for report in step.reports]
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
    rebuild(sessions, PROJECTIONS, batch=2)
    with sessions() as session:
        assert snapshot(session) == kept


def test_the_rebuild_command_makes_what_was_lost_again(
    database_url: str, sessions: sessionmaker[Session]
) -> None:
    play(
        sessions,
        [
            Batch((Report(0, 0, 0, False, False, 0, 1, 1, 1.0),), ()),
            Batch((Report(0, 0, 1, False, False, 0, 2, 1, 0.5),), ()),
            Batch((Report(1, 1, 0, True, False, 1, 3, 2, 1.0),), ()),
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
        "no projection named 'nope': known are activity, latest, latest_serving, sums, queue"
        in (" ".join(done.stderr.split()))
    )


def test_a_projection_step_left_out_is_caught(
    engine: Engine, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above tells: ingest without the latest curves' step differs from
    the rebuild."""
    from fleetbench.registry import projections
    from fleetbench.registry.projections.latest import LATEST

    without = tuple(p for p in PROJECTIONS if p is not LATEST)
    monkeypatch.setattr(projections, "PROJECTIONS", without)
    monkeypatch.setattr("fleetbench.registry.ingest.batch.PROJECTIONS", without)
    play(sessions, [Batch((Report(0, 0, 0, False, False, 0, 1, 1, 1.0),), ())])
    with sessions() as session:
        kept = snapshot(session)
    rebuild(sessions, PROJECTIONS)
    with sessions() as session:
        assert snapshot(session)["latest_runs"] != kept["latest_runs"]
