"""The placement question: each node's choice in SQL (crud.node_choices, on both databases)
and the fleet's answer as a pure function over those rows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import crud
from registry.models import Node
from registry.questions.placement import NodeChoice, answer_placement
from tests.conftest import ARTICLE_TABLE, make_report

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


def test_candidates_sorted_by_total_throughput() -> None:
    answer = answer_placement(
        model="nemo",
        min_tps_per_user=10,
        qualifying=[
            _choice("slow", 2, 22.0),
            _choice("fast", 16, 480.0),
            _choice("m4", 16, 163.18),
        ],
    )
    assert [(c.node, c.concurrency, c.total_tps) for c in answer.candidates] == [
        ("fast", 16, 480.0),
        ("m4", 16, 163.18),
        ("slow", 2, 22.0),
    ]
    assert answer.candidates[1].per_user_tps == pytest.approx(10.19875)
    assert answer.reason == "3 node(s) meet 10 tokens/s per user on nemo"


def test_none_qualifies_reason_names_the_best_available() -> None:
    answer = answer_placement(
        model="nemo",
        min_tps_per_user=50,
        qualifying=[],
        fastest=[_choice("m4pro", 1, 28.30), _choice("other", 2, 40.0)],
    )
    assert answer.candidates == []
    assert "the best available is m4pro at concurrency 1 with 28.30 tokens/s per user" in (
        answer.reason
    )


def test_no_prompt_that_long_names_the_longest_measured() -> None:
    answer = answer_placement(
        model="nemo",
        min_tps_per_user=1,
        qualifying=[],
        prompt_tokens=8192,
        longest_prompt=("m4pro", 512),
    )
    assert "the longest measured is 512 tokens (node m4pro)" in answer.reason


def test_nothing_reported() -> None:
    answer = answer_placement(model="nemo", min_tps_per_user=5, qualifying=[], max_age_days=7)
    assert answer.reason == "no successful run of nemo has been reported in the last 7 days"


# --- each node's choice, in SQL ------------------------------------------------------------


def _store(session: Session, **report_fields: object) -> None:
    report = make_report(**report_fields)  # type: ignore[arg-type]
    crud.create_node_token(session, node_name=report.node, labels={})
    node = session.scalars(select(Node).where(Node.name == report.node)).one()
    crud.ingest_report(session, report=report, node=node)
    session.commit()


def _choices(
    session: Session, min_tps: float | None, prompt_tokens: int | None = None
) -> list[tuple[str, int, int]]:
    model_ids = [m.id for m in crud.find_models(session, "Mistral-Nemo-Instruct-2407-Q4_K_M")]
    rows = crud.node_choices(
        session,
        model_ids=model_ids,
        since=None,
        prompt_tokens=prompt_tokens,
        min_tps_per_user=min_tps,
    )
    return sorted((c.node, c.pp, c.b) for c in rows)


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
    assert _choices(session, 50) == []
    assert _choices(session, None) == [("m4pro", 512, 1)]  # 28.30 per user at B=1


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
    model_ids = [m.id for m in crud.find_models(session, report.model.name)]
    too_long = crud.placement_rows(
        session, model_ids=model_ids, since=None, prompt_tokens=8192, min_tps_per_user=14
    )
    assert too_long == crud.PlacementRows([], [], ("m4pro", 4096))
    too_fast = crud.placement_rows(
        session, model_ids=model_ids, since=None, prompt_tokens=2000, min_tps_per_user=30
    )
    assert [(c.pp, c.b) for c in too_fast.fastest] == [(4096, 1)]
    assert (too_fast.qualifying, too_fast.longest_prompt) == ([], None)


def test_ties_on_concurrency_go_to_the_higher_throughput(session: Session) -> None:
    faster_tg = make_report(table=ARTICLE_TABLE).points + [
        p.model_copy(update={"tg": 256, "s_tg": 140.0, "n_kv": None})
        for p in make_report(table=[(8, 285.0, 140.0)]).points
    ]
    _store(session, points=faster_tg)
    model_ids = [m.id for m in crud.find_models(session, "mistral-nemo-instruct-2407-q4_k_m")]
    [choice] = crud.node_choices(
        session, model_ids=model_ids, since=None, prompt_tokens=None, min_tps_per_user=15
    )
    assert (choice.b, choice.tg, choice.s_tg) == (8, 256, 140.0)
