"""Serving sweeps against other real servers and real failures: llama-cpp-python's own
OpenAI-compatible server (a second implementation of the protocol), llama-server on the tiny
GGUF with its Prometheus /metrics instead of /slots, a llama-server killed mid-sweep, and a
server that dies under the CLI with the run still reported."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx

from fleetbench.agent.serving.report import serving_report
from fleetbench.agent.serving.servers import identify_at, in_flight, metrics_in_flight
from fleetbench.agent.serving.sweep import serve_sweep
from fleetbench.contract.serve_spec import ServeSpec
from fleetbench.contract.wire import ServingPoint
from tests.agent.real_servers import llama_cpp_python_server
from tests.agent.real_servers import llama_server as running_llama_server
from tests.agent.serving_stub import stub_server
from tests.factories import DAY0, LiveRegistry, agent, post_report

SMALL = ServeSpec(concurrency=(1, 2), prompt_tokens=16, gen_tokens=8, requests=4)


def test_llama_cpp_pythons_server_is_measured_as_an_openai_compatible_one(
    gemma: Path, tmp_path: Path
) -> None:
    spec = ServeSpec(concurrency=(1, 2), prompt_tokens=16, gen_tokens=16, requests=4)
    with llama_cpp_python_server(gemma, tmp_path / "server.log", interrupt=False) as (url, _):
        outcome = serve_sweep(url, "gemma-3-270m", spec)
    assert (outcome.server.kind, outcome.prompt_exact) == ("openai-compatible", False)
    assert "prompt lengths are approximate" in outcome.warnings[0]
    assert outcome.failures == []
    one, two = outcome.points
    for point in (one, two):
        assert (point.completed, point.output_tokens, point.errors) == (4, 64, {})
    # It serves one request at a time. The signs are compared within the two users' point
    # (the machine's load may change between points): a waiting user's first token comes
    # after the other's whole decode (3 of the 4 requests wait), and the two together decode
    # no faster than one alone (a server that batched them would near twice one's speed).
    assert two.per_user_tps_p50 is not None and two.ttft_ms_p50 is not None
    decode_ms = 1000 * (spec.gen_tokens - 1) / two.per_user_tps_p50
    assert two.ttft_ms_p50 > 0.8 * decode_ms
    assert two.total_tps < 1.2 * two.per_user_tps_p50  # type: ignore[operator]


def test_a_server_cutting_requests_short_gives_errors_not_tokens(
    gemma: Path, tmp_path: Path
) -> None:
    # llama-cpp-python's server as it starts by default: a new request interrupts the one
    # streaming, which ends early with finish_reason "length" as if complete
    with llama_cpp_python_server(gemma, tmp_path / "server.log", interrupt=True) as (url, _):
        outcome = serve_sweep(url, "gemma-3-270m", SMALL)
    one, two = outcome.points
    assert (one.completed, one.errors) == (4, {})  # alone, nothing interrupts it
    assert two.errors["short output"] >= 1
    assert two.completed == 4 - two.errors["short output"]
    assert two.output_tokens < 4 * 8


def test_llama_server_without_slots_is_asked_through_its_metrics(
    llama_server: Path, tiny_llama: Path, tmp_path: Path
) -> None:
    with running_llama_server(
        llama_server,
        tiny_llama,
        tmp_path / "server.log",
        slots=4,
        ctx_per_slot=256,
        extra=("--metrics", "--no-slots"),
    ) as (url, _):
        with httpx.Client(base_url=url) as client:
            assert client.get("/slots").status_code != 200  # --no-slots
            assert in_flight(client) == 0  # llamacpp:requests_processing of /metrics
        outcome = serve_sweep(
            url, "tiny", ServeSpec(concurrency=(1, 2, 4), prompt_tokens=32, gen_tokens=16,
                                   requests=8)
        )  # fmt: skip
    assert outcome.server.kind == "llama-server" and outcome.prompt_exact
    assert outcome.server.slots == 4 and outcome.failures == []
    assert [(p.concurrency, p.completed, p.output_tokens) for p in outcome.points] == [
        (1, 8, 128),
        (2, 8, 128),
        (4, 8, 128),
    ], [p.errors for p in outcome.points]


def test_a_llama_server_killed_mid_sweep_keeps_the_points_before_and_records_the_rest(
    llama_server: Path, tiny_llama: Path, tmp_path: Path, live_registry: LiveRegistry
) -> None:
    with running_llama_server(
        llama_server, tiny_llama, tmp_path / "server.log", slots=4, ctx_per_slot=256
    ) as (url, process):

        def kill_after_the_first(point: ServingPoint) -> None:
            process.send_signal(signal.SIGKILL)
            process.wait()

        spec = ServeSpec(concurrency=(1, 2, 4), prompt_tokens=16, gen_tokens=8, requests=4)
        outcome = serve_sweep(url, "tiny", spec, on_point=kill_after_the_first)
    assert [p.concurrency for p in outcome.points] == [1]
    (two, why_two), (four, why_four) = outcome.failures
    assert (two, four) == (2, 4)
    assert why_two.startswith("every request failed: ") and "refused" in why_two
    assert why_four == f"not measured: the server at {url} stopped answering"
    run = serving_report(
        outcome, spec, model="tiny", node="gpu-1", started_at=DAY0, finished_at=DAY0,
        hardware=None,
    )  # fmt: skip
    with live_registry.client(live_registry.token("gpu-1")) as client:
        assert post_report(client, run).status_code == 201
        detail = client.get(f"/v1/runs/{run.run_id}").json()
    assert detail["status"] == "partial"
    assert [(f["b"], f["reason"]) for f in detail["failures"]] == [(2, why_two), (4, why_four)]


def test_a_server_dying_under_the_cli_leaves_it_alive_and_the_run_reported(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    token = live_registry.token("gpu-2")
    # 1 warm-up and 4 requests at C=1, then 2 warm-ups at C=2: it dies as C=2 is measured
    with stub_server(slots=4, die_after=7) as stub:
        done = agent(
            "serve-sweep", "--url", stub.url, "--model", "m", "--concurrency", "1,2,4",
            "--prompt-tokens", "8", "--gen-tokens", "8", "--requests", "4", "--report",
            FLEETBENCH_NODE="gpu-2", FLEETBENCH_REGISTRY_URL=live_registry.url,
            FLEETBENCH_TOKEN=token, FLEETBENCH_SPOOL=str(tmp_path / "spool.db"),
        )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "concurrency 2: every request failed: " in done.stderr
    assert f"concurrency 4: not measured: the server at {stub.url} stopped answering" in (
        done.stderr
    )
    with live_registry.client() as client:
        [run] = client.get("/v1/runs", params={"node": "gpu-2"}).json()["data"]
        detail = client.get(f"/v1/runs/{run['id']}").json()
    assert (detail["status"], detail["kind"]) == ("partial", "serving")
    assert [p["concurrency"] for p in detail["serving_points"]] == [1]
    assert [f["b"] for f in detail["failures"]] == [2, 4]


def test_a_level_can_last_seconds_instead_of_requests() -> None:
    with stub_server(slots=4, token_interval_s=0.01) as stub:
        done = agent(
            "serve-sweep", "--url", stub.url, "--model", "m", "--concurrency", "2",
            "--prompt-tokens", "8", "--gen-tokens", "10", "--duration", "1", "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [point] = json.loads(done.stdout)["points"]
    # two users, 100 ms a request, for a second: about 10 requests each
    assert 14 <= point["requests"] <= 24 and point["completed"] == point["requests"]
    assert 1.0 <= point["seconds"] < 1.5
    assert point["output_tokens"] == 10 * point["requests"]


def test_what_a_server_says_that_is_not_what_it_should_be_is_not_known() -> None:
    with stub_server(slots=2) as stub:
        stub.props = {"build_info": "b1-abc", "default_generation_settings": [],
                      "total_slots": True}  # fmt: skip
        server = identify_at(stub.url)
    assert server is not None and server.kind == "llama-server"
    assert (server.slots, server.n_ctx, server.ctx_per_slot) == (None, None, None)
    for gauge in ("NaN", "+Inf", "-1", "1e40"):
        assert metrics_in_flight(f"llamacpp:requests_processing {gauge}\n") is None
    assert metrics_in_flight('vllm:num_requests_running{model_name="a"} 2.0\n'
                             'vllm:num_requests_running{model_name="b"} 1.0\n') == 3  # fmt: skip


def test_a_slow_server_is_not_taken_for_gone() -> None:
    # every first token later than the client waits: each level fails, but the server still
    # says what it is, so the next level is measured rather than written off
    with stub_server(slots=1, token_interval_s=1.0, version="0.6") as stub:
        outcome = serve_sweep(
            stub.url, "m", ServeSpec(concurrency=(1, 2), prompt_tokens=8, gen_tokens=4,
                                     requests=2, first_token_timeout_s=0.3)
        )  # fmt: skip
    assert outcome.failures == [
        (1, "every request failed: 2 timeout"),
        (2, "every request failed: 2 timeout"),
    ]
    assert any("does not say how many requests it is processing" in w for w in outcome.warnings)


def test_a_timed_level_stops_sending_to_a_server_that_fails_every_request() -> None:
    with stub_server(slots=4, refuse_over=0) as stub:  # 503 for everything
        outcome = serve_sweep(
            stub.url, "m", ServeSpec(concurrency=(2,), prompt_tokens=8, gen_tokens=4,
                                     duration_s=2)
        )  # fmt: skip
        sent = stub.requests
    # two users, three failed requests each (after the two warm-ups), not two seconds' worth
    assert outcome.failures == [(2, "every request failed: 6 http 503")]
    assert sent == 2 + 6


def test_concurrencies_given_twice_are_refused_before_the_server_is_asked() -> None:
    done = agent("serve-sweep", "--url", "http://127.0.0.1:1", "--model", "m",
                 "--concurrency", "1,2,1")  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--concurrency" in done.stderr and "given twice" in done.stderr


def test_the_search_on_a_real_llama_server_ends_where_more_users_add_nothing(
    llama_server: Path, tiny_llama: Path, tmp_path: Path
) -> None:
    with running_llama_server(
        llama_server, tiny_llama, tmp_path / "server.log", slots=2, ctx_per_slot=256
    ) as (url, _):
        spec = ServeSpec(slo="tps_per_user_p10>=1", prompt_tokens=16, gen_tokens=64,
                         requests=8, max_concurrency=16)  # fmt: skip
        outcome = serve_sweep(url, "tiny", spec)
    search = outcome.search
    assert search is not None and outcome.failures == []
    measured = [p.concurrency for p in outcome.points]
    # doubling from 1: every user of a 2-slot server past the second only waits
    assert measured == [1, 2, 4, 8, 16][: len(measured)] and len(measured) >= 2
    assert search.concurrency == measured[-1]
    assert search.stop_reason.startswith(
        ("throughput plateau: ", "reached the largest concurrency allowed (16)")
    )
    assert all(p.output_tokens == 64 * p.requests for p in outcome.points)
