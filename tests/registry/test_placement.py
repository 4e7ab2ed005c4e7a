"""The placement question: each node's choice in SQL (registry.placement.offline_rows, on both
databases) and the fleet's answer as a pure function over those rows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetbench.registry import crud, tokens
from fleetbench.registry.models import Node
from fleetbench.registry.placement import offline_rows
from fleetbench.registry.placement.rules import (
    NodeChoice,
    PlacementFindings,
    PlacementQuestion,
    answer_placement,
)
from tests.factories import ARTICLE_TABLE, make_report, store_report

RUN = uuid.UUID(int=1)
WHEN = datetime(2026, 10, 16, tzinfo=UTC)


def _choice(node: str, b: int, s_tg: float, *, pp: int = 512) -> NodeChoice:
    return NodeChoice(
        node=node,
        run_id=RUN,
        measured_at=WHEN,
        llama_cpp_build=11429,
        pp=pp,
        tg=128,
        b=b,
        s_pp=280.0,
        s_tg=s_tg,
    )


# --- the fleet's answer, on literal rows ---------------------------------------------------


def test_answer_lists_the_given_candidates_and_counts_all() -> None:
    answer = answer_placement(
        "nemo",
        PlacementQuestion(min_tps_per_user=10),
        PlacementFindings(
            qualifying=[_choice("fast", 16, 480.0), _choice("m4", 16, 163.18)], qualifying_count=3
        ),
    )
    assert [(c.node, c.concurrency, c.total_tps) for c in answer.candidates] == [
        ("fast", 16, 480.0),
        ("m4", 16, 163.18),
    ]
    assert answer.candidates[1].per_user_tps == pytest.approx(10.19875)
    assert answer.count == 3
    assert answer.reason == (
        "3 node(s) meet 10 tokens/s per user on nemo; "
        "the 2 with the highest total throughput are listed"
    )


def test_none_qualifies_reason_names_the_best_available() -> None:
    answer = answer_placement(
        "nemo",
        PlacementQuestion(min_tps_per_user=50),
        PlacementFindings(qualifying=[], qualifying_count=0, fastest=_choice("m4pro", 1, 28.30)),
    )
    assert answer.candidates == []
    assert "the best available is m4pro at concurrency 1 with 28.30 tokens/s per user" in (
        answer.reason
    )


def test_no_prompt_that_long_names_the_longest_measured() -> None:
    answer = answer_placement(
        "nemo",
        PlacementQuestion(min_tps_per_user=1, prompt_tokens=8192),
        PlacementFindings(qualifying=[], qualifying_count=0, longest_prompt=("m4pro", 512)),
    )
    assert "the longest measured is 512 tokens (node m4pro)" in answer.reason


def test_nothing_reported() -> None:
    answer = answer_placement(
        "nemo",
        PlacementQuestion(min_tps_per_user=5, max_age_days=7),
        PlacementFindings(qualifying=[], qualifying_count=0),
    )
    assert answer.reason == "no successful run of nemo has been reported in the last 7 days"


# --- each node's choice, in SQL ------------------------------------------------------------


def _store(session: Session, **report_fields: object) -> None:
    report = make_report(**report_fields)  # type: ignore[arg-type]
    tokens.create_node_token(session, node_name=report.node, labels={})
    node = session.scalars(select(Node).where(Node.name == report.node)).one()
    store_report(session, report, node.id)
    session.commit()


def _rows(
    session: Session, min_tps: float, prompt_tokens: int | None = None, limit: int = 100
) -> offline_rows.PlacementRows:
    model_ids = [m.id for m in crud.find_models(session, "Mistral-Nemo-Instruct-2407-Q4_K_M")]
    return offline_rows.placement_rows(
        session,
        model_ids=model_ids,
        since=None,
        prompt_tokens=prompt_tokens,
        min_tps_per_user=min_tps,
        limit=limit,
    )


def _choices(
    session: Session, min_tps: float, prompt_tokens: int | None = None
) -> list[tuple[str, int, int]]:
    return [(c.node, c.pp, c.b) for c in _rows(session, min_tps, prompt_tokens).qualifying]


@pytest.mark.parametrize(
    ("min_tps", "expected_b"), [(28.3, 1), (20, 2), (17, 4), (15, 8), (10, 16), (6, 32)]
)
def test_largest_concurrency_meeting_the_threshold(
    session: Session, min_tps: float, expected_b: int
) -> None:
    _store(session)
    assert _choices(session, min_tps) == [("m4pro", 512, expected_b)]


def test_node_that_meets_nothing_is_left_out_but_offers_its_fastest(session: Session) -> None:
    _store(session)
    rows = _rows(session, 50)
    assert (rows.qualifying, rows.qualifying_count) == ([], 0)
    assert rows.fastest is not None
    assert (rows.fastest.b, rows.fastest.s_tg) == (1, 28.30)  # 28.30 per user at B=1


def test_qualifying_nodes_first_best_total_first_and_limited(session: Session) -> None:
    fast = [(1, 900.0, 60.0), (8, 900.0, 320.0), (16, 900.0, 400.0)]
    slow = [(1, 100.0, 12.0), (2, 100.0, 13.0)]
    for node, table in (("m4pro", ARTICLE_TABLE), ("h100", fast), ("old", slow)):
        _store(session, node=node, table=table)
    rows = _rows(session, 15)
    assert [(c.node, c.b) for c in rows.qualifying] == [("h100", 16), ("m4pro", 8)]
    assert (rows.qualifying_count, rows.fastest) == (2, None)
    top = _rows(session, 15, limit=1)
    assert ([c.node for c in top.qualifying], top.qualifying_count) == (["h100"], 2)


def test_smallest_prompt_length_at_least_p(session: Session) -> None:
    curves = {  # PP: (B, S_PP, S_TG): per user 20/15/12.5 at B=8
        128: [(1, 300.0, 30.0), (8, 300.0, 160.0)],
        1024: [(1, 280.0, 28.0), (8, 280.0, 120.0)],
        4096: [(1, 250.0, 25.0), (8, 250.0, 100.0)],
    }
    report = make_report()
    points = [
        p.model_copy(update={"pp": pp, "n_kv": None})
        for pp, table in curves.items()
        for p in make_report(table=table, pp=pp).points
    ]
    _store(session, run_id=report.run_id, points=points)
    assert _choices(session, 14) == [("m4pro", 128, 8)]
    assert _choices(session, 14, prompt_tokens=600) == [("m4pro", 1024, 8)]
    assert _choices(session, 14, prompt_tokens=1024) == [("m4pro", 1024, 8)]
    # at PP=4096, B=8 gives only 12.5 per user: B=1 (25) it is
    assert _choices(session, 14, prompt_tokens=2000) == [("m4pro", 4096, 1)]
    assert _choices(session, 14, prompt_tokens=8192) == []
    assert _rows(session, 14, prompt_tokens=8192) == offline_rows.PlacementRows(
        [], 0, None, ("m4pro", 4096), {}
    )
    too_fast = _rows(session, 30, prompt_tokens=2000)
    assert too_fast.fastest is not None
    assert (too_fast.fastest.pp, too_fast.fastest.b) == (4096, 1)
    assert (too_fast.qualifying, too_fast.longest_prompt) == ([], None)


def test_ties_on_concurrency_go_to_the_higher_throughput(session: Session) -> None:
    faster_tg = make_report(table=ARTICLE_TABLE).points + [
        p.model_copy(update={"tg": 256, "s_tg": 140.0, "n_kv": None})
        for p in make_report(table=[(8, 285.0, 140.0)]).points
    ]
    _store(session, points=faster_tg)
    [choice] = _rows(session, 15).qualifying
    assert (choice.b, choice.tg, choice.s_tg) == (8, 256, 140.0)
