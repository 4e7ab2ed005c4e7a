"""The output fingerprint through a real llama-server on Gemma 3 270M Q4_K_M: a serving sweep
carries it, a llama-batched-bench sweep takes it with the llama-server of its build, the two
real builds (the llama.cpp llama-cpp-python vendors, and release b11434 built from source)
compare within their floor, and where it cannot be taken the run stands without it, saying
why."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.batched_bench_binary import BatchedBenchBinaryRunner, binary_build
from fleetbench.agent.serving.report import serving_report
from fleetbench.agent.serving.sweep import serve_sweep
from fleetbench.agent.sweep import measure_run
from fleetbench.contract.build_label import build_label
from fleetbench.contract.outputs import TEXT_VERSION, TOP_K, compare_outputs
from fleetbench.contract.serve_spec import ServeSpec
from fleetbench.contract.wire import RunReport
from fleetbench.registry.compare.outputs import RunOutputs, judge_outputs
from tests.agent.real_servers import llama_server as running_llama_server
from tests.agent.test_outputs import POSITIONS, SPEC

SERVE = ServeSpec(concurrency=(1,), prompt_tokens=16, gen_tokens=4, requests=2)


@pytest.fixture(scope="module")
def served(
    llama_server: Path, gemma: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """llama-server with one slot of 512 tokens on Gemma, on a loopback port."""
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with running_llama_server(llama_server, gemma, log, slots=1, ctx_per_slot=512) as (url, _):
        yield url


def _binary_sweep(
    binary: Path, model: Path, capsys: pytest.CaptureFixture[str], spec: SweepSpec = SPEC
) -> RunReport:
    report = measure_run(model, spec, BatchedBenchBinaryRunner(binary), node="cpu-node")
    assert report.status == "ok", capsys.readouterr().err[-2000:]
    return report


def test_a_serving_sweep_of_llama_server_carries_the_fingerprint(served: str) -> None:
    outcome = serve_sweep(served, "gemma-3-270m", SERVE)
    taken = outcome.outputs
    assert taken is not None, outcome.warnings
    assert (taken.text_version, taken.n_vocab, len(taken.ids)) == (TEXT_VERSION, 262144, POSITIONS)
    assert all(len(ids) == TOP_K for ids in taken.ids)
    assert all(lp == sorted(lp, reverse=True) for lp in taken.logprobs)
    assert taken.seconds is not None and taken.seconds > 0
    report = serving_report(
        outcome,
        SERVE,
        model="gemma-3-270m",
        node="cpu-node",
        started_at=datetime.now(UTC),
        finished_at=datetime.now(UTC),
        hardware=None,
    )
    assert RunReport.model_validate_json(report.model_dump_json()).outputs == taken
    again = serve_sweep(served, "gemma-3-270m", SERVE).outputs
    assert again is not None
    same = compare_outputs(taken, again)  # one server, the same requests: the same logits
    assert same is not None and same.top_token_agreement == 1.0 and same.mean_kl < 1e-6


def test_a_sweep_asked_for_no_outputs_asks_the_server_for_none(served: str) -> None:
    outcome = serve_sweep(served, "gemma-3-270m", SERVE.model_copy(update={"outputs": False}))
    assert outcome.points and outcome.outputs is None


def test_a_server_whose_slots_cannot_hold_the_text_is_not_fingerprinted(
    llama_server: Path, gemma: Path, tmp_path: Path
) -> None:
    with running_llama_server(
        llama_server, gemma, tmp_path / "server.log", slots=1, ctx_per_slot=256
    ) as (url, _):
        outcome = serve_sweep(url, "gemma-3-270m", SERVE)
    assert outcome.points and outcome.outputs is None
    assert (
        "no output fingerprint: the server's slots hold 256 tokens, fewer than the "
        "reference text's 349" in outcome.warnings
    )


def test_a_binary_sweep_takes_it_with_the_llama_server_of_its_build(
    batched_bench: Path,
    llama_server: Path,
    gemma: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert llama_server.parent == batched_bench.parent
    one_thread = SPEC.model_copy(update={"n_threads": 1})
    report = _binary_sweep(batched_bench, gemma, capsys, one_thread)
    taken = report.outputs
    assert taken is not None and len(taken.ids) == POSITIONS
    # the same build and the same computation (a token at a time, Gemma's sliding-window
    # cache kept whole as the agent's own server keeps it, one thread: two gave a KL mean of
    # 0.0014 against one here) as a server a team runs so
    log = tmp_path / "server.log"
    with running_llama_server(
        llama_server, gemma, log, slots=1, ctx_per_slot=2048, extra=("--swa-full",)
    ) as (url, _):
        served = serve_sweep(url, "gemma-3-270m", SERVE).outputs
    assert served is not None
    same = compare_outputs(served, taken)
    assert same is not None and same.top_token_agreement == 1.0 and same.mean_kl < 1e-6


def test_a_binary_without_its_llama_server_beside_it_takes_none_and_says_why(
    batched_bench: Path, gemma: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alone = tmp_path / "bin" / batched_bench.name
    alone.parent.mkdir()
    shutil.copy2(batched_bench, alone)  # a static build: it runs anywhere
    report = _binary_sweep(alone, gemma, capsys)
    assert report.points and report.outputs is None
    assert f"warning: no output fingerprint: no llama-server beside {alone}" in (
        capsys.readouterr().err
    )


def test_a_llama_server_of_another_build_is_not_taken_for_the_binarys(
    batched_bench: Path,
    release_llama_server: Path,
    gemma: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mixed = tmp_path / "bin"
    mixed.mkdir()
    shutil.copy2(batched_bench, mixed / batched_bench.name)
    shutil.copy2(release_llama_server, mixed / "llama-server")
    report = _binary_sweep(mixed / batched_bench.name, gemma, capsys)
    assert report.points and report.outputs is None
    ours = build_label(binary_build(batched_bench))
    assert f"is llama.cpp b11434, the sweep's binary {ours}:" in capsys.readouterr().err


def test_two_real_builds_compare_within_their_floor(
    batched_bench: Path,
    llama_server: Path,
    release_batched_bench: Path,
    release_llama_server: Path,
    gemma: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The vendored llama.cpp and release b11434, a sweep of each, judged as compare judges a
    node upgraded from one to the other (bench/outputs_across_builds.py runs more of each:
    their run-to-run floor was 0 there)."""
    old = _binary_sweep(batched_bench, gemma, capsys).outputs
    new = _binary_sweep(release_batched_bench, gemma, capsys).outputs
    assert old is not None and new is not None
    runs = [
        RunOutputs("cpu-node", "CPU", 1, "offline llama.cpp CPU llama-batched-bench", after, o)
        for after, o in ((False, old), (True, new))
    ]
    verdict = judge_outputs(runs, min_kl=0.01)["CPU"]
    assert verdict.state in ("unchanged", "within the floor"), verdict.reason
    assert verdict.worst.top_token_agreement > 0.95
