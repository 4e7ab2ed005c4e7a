"""The placement question as a pure function, on literal tables."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from registry.questions.placement import MeasuredPoint, place
from tests.conftest import ARTICLE_TABLE

RUN = uuid.UUID(int=1)
WHEN = datetime(2026, 10, 16, tzinfo=UTC)


def _points(
    node: str, table: list[tuple[int, float, float]], *, pp: int = 512, tg: int = 128
) -> list[MeasuredPoint]:
    return [
        MeasuredPoint(
            node=node,
            run_id=RUN,
            measured_at=WHEN,
            llama_cpp_build=11429,
            pp=pp,
            tg=tg,
            b=b,
            s_pp=s_pp,
            s_tg=s_tg,
        )
        for b, s_pp, s_tg in table
    ]


def test_article_m4pro_at_15_tps_per_user_is_concurrency_8() -> None:
    answer = place(_points("m4pro", ARTICLE_TABLE), model="nemo", min_tps_per_user=15)
    [candidate] = answer.candidates
    assert candidate.node == "m4pro"
    assert candidate.concurrency == 8
    assert candidate.per_user_tps == pytest.approx(16.706, abs=1e-3)
    assert candidate.total_tps == 133.65
    assert candidate.prefill_tps == 285.83
    assert (candidate.prompt_tokens, candidate.gen_tokens) == (512, 128)


@pytest.mark.parametrize(
    ("min_tps", "expected_b"), [(28.3, 1), (20, 2), (17, 4), (10, 16), (6, 32), (1, 32)]
)
def test_largest_concurrency_meeting_the_threshold(min_tps: float, expected_b: int) -> None:
    answer = place(_points("m4pro", ARTICLE_TABLE), model="nemo", min_tps_per_user=min_tps)
    assert [c.concurrency for c in answer.candidates] == [expected_b]


def test_none_qualifies_reason_names_the_best_available() -> None:
    answer = place(_points("m4pro", ARTICLE_TABLE), model="nemo", min_tps_per_user=50)
    assert answer.candidates == []
    assert "m4pro at concurrency 1 with 28.30 tokens/s per user" in answer.reason


def test_no_points_at_all() -> None:
    answer = place([], model="nemo", min_tps_per_user=5)
    assert answer.candidates == []
    assert "no successful run of nemo" in answer.reason


def test_candidates_sorted_by_total_throughput() -> None:
    slow = [(1, 100.0, 12.0), (2, 100.0, 22.0), (4, 100.0, 30.0)]  # 10 t/s/user at B=2 -> 22
    fast = [(1, 900.0, 80.0), (8, 900.0, 400.0), (16, 900.0, 480.0)]  # B=16 -> 30/user
    answer = place(
        _points("slow", slow) + _points("fast", fast) + _points("m4pro", ARTICLE_TABLE),
        model="nemo",
        min_tps_per_user=10,
    )
    assert [(c.node, c.concurrency, c.total_tps) for c in answer.candidates] == [
        ("fast", 16, 480.0),
        ("m4pro", 16, 163.18),
        ("slow", 2, 22.0),
    ]


def test_prompt_tokens_takes_smallest_measured_pp_at_least_p() -> None:
    short = _points("n", [(1, 300.0, 30.0), (8, 300.0, 160.0)], pp=128)  # 20/user at B=8
    medium = _points("n", [(1, 280.0, 28.0), (8, 280.0, 120.0)], pp=1024)  # 15/user at B=8
    long = _points("n", [(1, 250.0, 25.0), (8, 250.0, 100.0)], pp=4096)  # 12.5/user
    points = short + medium + long

    unconstrained = place(points, model="m", min_tps_per_user=14)
    at_600 = place(points, model="m", min_tps_per_user=14, prompt_tokens=600)
    at_1024 = place(points, model="m", min_tps_per_user=14, prompt_tokens=1024)
    at_2000 = place(points, model="m", min_tps_per_user=14, prompt_tokens=2000)

    assert [(c.prompt_tokens, c.concurrency) for c in unconstrained.candidates] == [(128, 8)]
    assert [(c.prompt_tokens, c.concurrency) for c in at_600.candidates] == [(1024, 8)]
    assert [(c.prompt_tokens, c.concurrency) for c in at_1024.candidates] == [(1024, 8)]
    # at PP=4096 B=8 gives only 12.5 per user: B=1 (25) is the answer
    assert [(c.prompt_tokens, c.concurrency) for c in at_2000.candidates] == [(4096, 1)]


def test_prompt_tokens_longer_than_anything_measured() -> None:
    answer = place(
        _points("m4pro", ARTICLE_TABLE), model="nemo", min_tps_per_user=1, prompt_tokens=8192
    )
    assert answer.candidates == []
    assert "the longest measured is 512 tokens (node m4pro)" in answer.reason
