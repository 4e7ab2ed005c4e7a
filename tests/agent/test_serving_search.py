"""The SLO search (`serve-sweep --slo`) against servers on loopback whose limits a test knows:
slots past which requests queue, a throughput that stops growing, a server shedding load;
and against a real llama-server. Every search stops saying why."""

from __future__ import annotations

import json

import pytest

from fleetbench.agent.serving.sweep import serve_sweep
from fleetbench.contract.serve_spec import Objective, ServeSpec
from tests.agent.serving_stub import stub_server
from tests.factories import agent


def _search(url: str, slo: str, **spec: object) -> tuple[list[int], object]:
    outcome = serve_sweep(
        url,
        "m",
        ServeSpec.model_validate(
            {"slo": slo, "prompt_tokens": 8, "gen_tokens": 20, "requests": 10, **spec}
        ),
    )
    return [p.concurrency for p in outcome.points], outcome


def test_the_search_doubles_then_bisects_to_the_last_concurrency_within_the_objective() -> None:
    # 4 slots, 20 tokens 10 ms apart: up to 4 users start at once (a first token in ~10 ms);
    # a 5th waits ~200 ms. The objective's 100 ms leaves a busy machine room on both sides.
    with stub_server(slots=4, token_interval_s=0.01) as stub:
        measured, outcome = _search(stub.url, "ttft_p90<=100ms")
    search = outcome.search  # type: ignore[attr-defined]
    assert measured == [1, 2, 4, 5, 6, 8]  # doubled 1, 2, 4, 8; then 6 and 5 between 4 and 8
    assert search.concurrency == 4
    assert search.stop_reason.startswith("objective failed at concurrency 5: ttft_p90 ")
    assert "> 100 ms" in search.stop_reason
    assert search.objective == "ttft_p90<=100ms"
    four = outcome.points[2]  # type: ignore[attr-defined]
    assert four.ttft_ms_p90 < 100 and four.errors == {}


@pytest.mark.alone  # compares the throughput of points measured one after the other
def test_the_search_stops_where_doubling_adds_no_throughput() -> None:
    # 2 slots: 2 users get twice 1 user's throughput, 4 users no more than 2 (requests of
    # 400 ms: the client's turnaround between two, which 2 users leave a slot idle for and 4
    # do not, is a small share of them)
    with stub_server(slots=2, token_interval_s=0.01) as stub:
        measured, outcome = _search(stub.url, "tps_per_user_p10>=1", gen_tokens=40, requests=8)
    search = outcome.search  # type: ignore[attr-defined]
    assert measured == [1, 2, 4]
    assert search.concurrency == 4  # it still meets the objective: users wait, none fails
    assert search.stop_reason.startswith("throughput plateau: concurrency 4 gave ")
    one, two, four = (p.total_tps for p in outcome.points)  # type: ignore[attr-defined]
    assert two > 1.6 * one and four < 1.05 * two


def test_the_search_stops_at_errors_and_keeps_the_largest_level_without_any() -> None:
    # 3 requests in flight at most: the 4th is answered 503, as a server shedding load does
    with stub_server(slots=8, refuse_over=3) as stub:
        measured, outcome = _search(stub.url, "tps_per_user_p10>=1")
    search = outcome.search  # type: ignore[attr-defined]
    assert measured == [1, 2, 3, 4]
    assert search.concurrency == 3
    assert search.stop_reason.startswith("errors at concurrency 4: ")
    assert "http 503" in search.stop_reason
    assert outcome.points[-1].errors["http 503"] > 0  # type: ignore[attr-defined]


def test_the_search_stops_when_its_time_budget_is_spent() -> None:
    with stub_server(slots=8) as stub:
        measured, outcome = _search(stub.url, "tps_per_user_p10>=1", search_budget_s=0.05)
    search = outcome.search  # type: ignore[attr-defined]
    assert measured == [1]
    assert (search.concurrency, search.stop_reason) == (1, "time budget of 0.05 s spent")


def test_the_search_ends_at_the_largest_concurrency_allowed() -> None:
    with stub_server(slots=8) as stub:
        measured, outcome = _search(stub.url, "tps_per_user_p10>=1", max_concurrency=6)
    search = outcome.search  # type: ignore[attr-defined]
    assert measured == [1, 2, 4, 6]
    assert (search.concurrency, search.stop_reason) == (
        6,
        "reached the largest concurrency allowed (6)",
    )


def test_a_server_that_dies_during_the_search_ends_it_with_the_points_measured() -> None:
    # 1 warm-up + 10 requests, then 2 warm-ups: it dies as level 2's counted requests begin
    with stub_server(slots=8, die_after=13) as stub:
        measured, outcome = _search(stub.url, "tps_per_user_p10>=1")
    search = outcome.search  # type: ignore[attr-defined]
    assert measured == [1]
    assert search.concurrency == 1
    assert search.stop_reason.startswith("errors at concurrency 2: every request failed: ")
    assert "refused" in search.stop_reason
    [(level, why)] = outcome.failures  # type: ignore[attr-defined]
    assert level == 2 and why.startswith("every request failed: ")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ttft_p90>=2000ms", "ttft_p90 is a latency: give an upper bound (<=)"),
        ("tps_per_user_p10<=10", "tps_per_user_p10 is a speed: give a lower bound (>=)"),
        ("ttft_p95<=100", "'ttft_p95' is no objective metric"),
        ("ttft_p90<=2000ms,ttft_p90<=1s", "a metric is bounded twice"),
        ("fast please", "is not a bound such as"),
        ("", "an objective needs at least one bound"),
        ("total_tps>=5ms", "total_tps is not measured in ms"),
    ],
)
def test_objectives_are_checked_with_what_is_wrong_named(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        Objective.parse(text)
    assert problem in str(caught.value)


def test_an_objective_is_written_one_way_and_says_why_a_point_misses_it() -> None:
    objective = Objective.parse(" TTFT_P90 <= 2s , tps_per_user_p10>=10 ")
    assert str(objective) == "ttft_p90<=2000ms,tps_per_user_p10>=10"
    assert ServeSpec(slo="ttft_p90<=2s").slo == "ttft_p90<=2000ms"


def test_the_cli_searches_and_says_where_and_why_it_stopped() -> None:
    # A request takes 200 ms; a fifth user waits that long for a slot, the first four about
    # 10 ms: the objective's 100 ms leaves a busy machine room on both sides. Five requests
    # a level: at C = 5 one round, whose users start together, so the fifth always waits
    # (p90 of 10, 10, 10, 10, 200 ms is 124 ms); over several rounds a busy machine's jitter
    # spread the users' starts, and a waiting user's slot came free sooner.
    with stub_server(slots=4, token_interval_s=0.01) as stub:
        done = agent(
            "serve-sweep", "--url", stub.url, "--model", "m", "--slo", "ttft_p90<=100ms",
            "--prompt-tokens", "8", "--gen-tokens", "20", "--requests", "5", "--json",
        )  # fmt: skip
        table = agent(
            "serve-sweep", "--url", stub.url, "--model", "m", "--slo", "ttft_p90<=100ms",
            "--prompt-tokens", "8", "--gen-tokens", "20", "--requests", "5",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    search = json.loads(done.stdout)["search"]
    assert search["concurrency"] == 4
    assert search["stop_reason"].startswith("objective failed at concurrency 5")
    assert table.returncode == 0, table.stderr
    assert "largest concurrency meeting ttft_p90<=100ms: 4 (objective failed at" in table.stdout
    bad = agent("serve-sweep", "--url", stub.url, "--model", "m", "--slo", "ttft_p90>=1")
    assert bad.returncode == 2 and "--slo" in bad.stderr and "upper bound" in bad.stderr
    both = agent(
        "serve-sweep", "--url", stub.url, "--model", "m", "--requests", "4", "--duration", "2"
    )
    assert both.returncode == 2 and "not both" in both.stderr and "Traceback" not in both.stderr
