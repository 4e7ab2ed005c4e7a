"""Regressions stored by the judge over a long history, straight through the storage layer."""

from __future__ import annotations

import random
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetbench.registry import crud, tokens
from fleetbench.registry.models import Regression
from fleetbench.registry.regressions.series import HISTORY_RUNS
from tests.factories import DAY0, make_report, scaled, store_report


def test_a_step_is_stored_once_however_long_the_history_grows(session: Session) -> None:
    tokens.create_node_token(session, node_name="m4pro", labels={})
    node = crud.find_node(session, "m4pro")
    assert node is not None
    rng = random.Random(7)
    runs = 30 + HISTORY_RUNS + 5  # the step leaves the detector's view long before the end
    for day in range(runs):
        build, factor = (11429, 1.0) if day < 30 else (11500, 0.8)
        report = make_report(
            table=scaled(factor * (1 + rng.gauss(0, 0.01))),
            build_number=build,
            started_at=DAY0 + timedelta(days=day),
        )
        store_report(session, report, node.id)
        session.commit()
    rows = session.scalars(select(Regression)).all()
    assert len(rows) == 12  # S_TG and S_PP at each of the 6 concurrencies, nothing else
    assert {r.first_seen_at for r in rows} == {DAY0 + timedelta(days=30)}
    assert all(r.cause_kinds == ["llama.cpp build"] for r in rows)
    assert all(-0.22 < r.change < -0.18 for r in rows)
