"""Placement from serving runs: each node answers from its latest serving run of the model
where it has one (the server the team runs: per-user speed read as its p10, TTFT p90 held
to `max_ttft_ms`), else from its engine's offline curve, and says which backs each
candidate; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from tests.factories import (
    ARTICLE_MODEL,
    DAY0,
    LiveRegistry,
    agent,
    make_report,
    make_serving_report,
    post_report,
)

# (C, total output t/s, p10 per-user t/s, TTFT p90 ms)
SERVED = [(1, 50.0, 45.0, 100.0), (2, 90.0, 40.0, 150.0), (4, 160.0, 35.0, 400.0),
          (8, 200.0, 20.0, 2500.0)]  # fmt: skip


def _fleet(registry: LiveRegistry, **serving: Any) -> None:
    """mac-a: the article's offline curve alone; gpu-b: the same curve, and a serving run."""
    for node in ("mac-a", "gpu-b"):
        with registry.client(registry.token(node)) as client:
            assert post_report(client, make_report(node=node, started_at=DAY0)).status_code == 201
    served = make_serving_report(
        node="gpu-b", model=ARTICLE_MODEL, points=SERVED, started_at=DAY0 + timedelta(hours=1)
    )
    with registry.client(registry.token("gpu-b")) as client:
        assert post_report(client, served).status_code == 201


def _place(registry: LiveRegistry, **params: Any) -> httpx.Response:
    with registry.client() as client:
        return client.get("/v1/placement", params={"model": ARTICLE_MODEL, **params})


def test_a_node_with_a_serving_run_answers_from_it_the_others_from_their_curves(
    live_registry: LiveRegistry,
) -> None:
    _fleet(live_registry)
    answer = _place(live_registry, min_tps_per_user=15).json()
    assert answer["kind"] == "any" and answer["count"] == 2
    served, offline = answer["candidates"]
    # gpu-b: the largest C whose p10 per-user speed meets 15 is 8 (20 tokens/s)
    assert (served["node"], served["source"], served["concurrency"]) == ("gpu-b", "serving", 8)
    assert (served["per_user_tps"], served["total_tps"], served["ttft_ms_p90"]) == (
        20.0,
        200.0,
        2500.0,
    )
    assert (served["server"], served["slots"], served["llama_cpp_build"]) == (
        "llama-server",
        4,
        7100,
    )
    assert served["past_knee"] is True  # the knee of 50, 90, 160, 200 is at 4: +10 per user past it
    # mac-a: its offline curve, B = 8 at 16.7 per user
    assert (offline["node"], offline["source"], offline["concurrency"]) == ("mac-a", "offline", 8)
    assert offline["ttft_ms_p90"] is None
    assert "(1 listed from their serving runs, 1 from their offline curves)" in answer["reason"]


def test_a_time_to_first_token_is_held_to_serving_runs(live_registry: LiveRegistry) -> None:
    _fleet(live_registry)
    answer = _place(live_registry, min_tps_per_user=15, max_ttft_ms=500).json()
    assert answer["max_ttft_ms"] == 500
    [served] = answer["candidates"]
    assert (served["node"], served["concurrency"], served["ttft_ms_p90"]) == ("gpu-b", 4, 400.0)
    assert answer["reason"].startswith(
        "1 node(s) meet 15 tokens/s per user with a first token within 500 ms (p90)"
    )
    # mac-a meets the speed on its offline curve, which says nothing of TTFT
    assert (
        "1 node(s) meeting the speed on their offline curves alone are left out"
        in (answer["reason"])
    )
    strict = _place(live_registry, min_tps_per_user=15, max_ttft_ms=50).json()
    assert strict["candidates"] == []
    assert strict["reason"].startswith(
        "no node meets 15 tokens/s per user with a first token within 50 ms (p90)"
    )
    assert (
        "the best available is gpu-b at concurrency 1 with 45.00 tokens/s per user"
        in (strict["reason"])
    )
    assert "TTFT p90 100 ms" in strict["reason"]


def test_kind_chooses_what_backs_the_answer(live_registry: LiveRegistry) -> None:
    _fleet(live_registry)
    offline = _place(live_registry, min_tps_per_user=15, kind="offline").json()
    assert [(c["node"], c["source"], c["concurrency"]) for c in offline["candidates"]] == [
        ("gpu-b", "offline", 8),
        ("mac-a", "offline", 8),
    ]
    serving = _place(live_registry, min_tps_per_user=15, kind="serving").json()
    assert [(c["node"], c["source"]) for c in serving["candidates"]] == [("gpu-b", "serving")]
    refused = _place(live_registry, min_tps_per_user=15, kind="offline", max_ttft_ms=500)
    assert refused.status_code == 422
    [problem] = refused.json()["detail"]
    assert problem["loc"] == ["query", "max_ttft_ms"]
    assert "offline curves have no time to first token" in problem["msg"]
    assert _place(live_registry, min_tps_per_user=15, kind="both").status_code == 422


def test_a_concurrency_with_errors_never_qualifies(live_registry: LiveRegistry) -> None:
    served = make_serving_report(
        node="gpu-c", model=ARTICLE_MODEL, points=SERVED, errors={8: {"http 503": 3}}
    )
    with live_registry.client(live_registry.token("gpu-c")) as client:
        assert post_report(client, served).status_code == 201
    answer = _place(live_registry, min_tps_per_user=15, kind="serving").json()
    assert [(c["node"], c["concurrency"]) for c in answer["candidates"]] == [("gpu-c", 4)]


def test_a_server_whose_slots_hold_less_than_the_context_is_left_out(
    live_registry: LiveRegistry,
) -> None:
    _fleet(live_registry)
    answer = _place(live_registry, min_tps_per_user=15, kind="serving", context_tokens=8000)
    assert answer.json()["candidates"] == []
    assert (
        "1 node(s) left out: their server holds fewer than 8000 tokens per slot "
        + ("(gpu-b: 4096)")
        in answer.json()["reason"]
    )
    fits = _place(live_registry, min_tps_per_user=15, kind="serving", context_tokens=4000).json()
    [candidate] = fits["candidates"]
    assert candidate["fit"] == "fits"


def test_an_older_serving_run_arriving_late_leaves_the_latest_alone(
    live_registry: LiveRegistry,
) -> None:
    _fleet(live_registry)
    older = make_serving_report(
        node="gpu-b", model=ARTICLE_MODEL, points=[(1, 10.0, 9.0, 50.0)], started_at=DAY0
    )
    newer = make_serving_report(
        node="gpu-b",
        model=ARTICLE_MODEL,
        points=[(1, 30.0, 28.0, 80.0), (2, 56.0, 26.0, 90.0)],
        started_at=DAY0 + timedelta(days=2),
    )
    with live_registry.client(live_registry.token("gpu-b")) as client:
        assert post_report(client, older).status_code == 201
        placed = _place(live_registry, min_tps_per_user=15, kind="serving").json()
        assert placed["candidates"][0]["concurrency"] == 8  # the run of DAY0 + 1 h
        assert post_report(client, newer).status_code == 201
    placed = _place(live_registry, min_tps_per_user=15, kind="serving").json()
    [candidate] = placed["candidates"]
    assert (candidate["concurrency"], candidate["run_id"]) == (2, str(newer.run_id))


def test_the_agent_asks_with_a_latency_objective(live_registry: LiveRegistry) -> None:
    _fleet(live_registry)
    done = agent(
        "placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "15", "--max-ttft-ms",
        "500", "--registry", live_registry.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "first token within 500 ms" in done.stdout
    row = next(line for line in done.stdout.splitlines() if "gpu-b" in line)
    assert "400" in row and "llama-server (4 slots)" in row
    offline = agent(
        "placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "15", "--kind", "offline",
        "--max-ttft-ms", "500", "--registry", live_registry.url,
    )  # fmt: skip
    assert offline.returncode == 2 and "Traceback" not in offline.stderr
    assert "offline curves have no time to first token" in offline.stderr
