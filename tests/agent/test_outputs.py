"""The model's output fingerprint in real in-process sweeps of Gemma 3 270M Q4_K_M: taken after
the points, the same in two runs of one build, far from the same model requantized to Q2_K
(llama.cpp's quantize with allow_requantize, standing in for a broken build), left out when
asked, and stored by the registry."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.agent.runners.llama_outputs import reduce_rows
from fleetbench.agent.sweep import measure_run
from fleetbench.contract.outputs import TEXT_VERSION, TOP_K, compare_outputs
from fleetbench.contract.wire import RunReport
from fleetbench.registry.compare.outputs import RunOutputs, judge_outputs
from tests.factories import LiveRegistry, post_report

SPEC = SweepSpec(npp=(16,), ntg=(4,), npl=(1,))
# Gemma 3's tokenizer splits the reference text into 349 tokens: 348 predicted positions
POSITIONS = 348


def _sweep(model: Path, spec: SweepSpec = SPEC) -> RunReport:
    return measure_run(model, spec, LlamaCppPythonRunner(), node="cpu-node")


@pytest.fixture(scope="module")
def requantized(gemma: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma requantized to Q2_K, in a process of its own (llama.cpp stays out of pytest's)."""
    out = tmp_path_factory.mktemp("q2k") / "gemma-3-270m-Q2_K.gguf"
    script = (
        "import sys, llama_cpp\n"
        "p = llama_cpp.llama_model_quantize_default_params()\n"
        "p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K; p.allow_requantize = True; p.nthread = 2\n"
        "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(gemma), str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_a_sweep_takes_the_fingerprint_and_two_runs_of_one_build_agree(gemma: Path) -> None:
    first, second = _sweep(gemma), _sweep(gemma)
    assert first.outputs is not None and second.outputs is not None
    taken = first.outputs
    assert (taken.text_version, taken.n_vocab, len(taken.ids)) == (TEXT_VERSION, 262144, POSITIONS)
    assert all(len(ids) == TOP_K for ids in taken.ids)
    assert all(lp == sorted(lp, reverse=True) for lp in taken.logprobs)  # likeliest first
    assert taken.seconds is not None and taken.seconds > 0
    same = compare_outputs(taken, second.outputs)
    assert same is not None
    assert (same.positions, same.top_token_agreement) == (POSITIONS, 1.0)
    assert same.mean_kl < 1e-6 and same.p99_kl < 1e-6


def test_the_model_requantized_to_q2_k_is_far_from_the_base(gemma: Path, requantized: Path) -> None:
    base, coarse = _sweep(gemma).outputs, _sweep(requantized).outputs
    assert base is not None and coarse is not None
    found = compare_outputs(base, coarse)
    assert found is not None and found.positions == POSITIONS
    # measured here: KL mean 0.238, p99 2.23, the top token the same at 64.7% of positions;
    # far above the 0.01 nats compare lets through (two runs of one build differ by 0)
    assert found.mean_kl > 0.1 and found.p99_kl > 1 and found.top_token_agreement < 0.85
    # as compare judges a node whose new build outputs these: changed
    runs = [RunOutputs("cpu-node", "CPU", 1, "llama.cpp CPU ngl -1", False, base)]
    same = judge_outputs([*runs, dataclasses.replace(runs[0], after=True)], min_kl=0.01)
    moved = judge_outputs(
        [*runs, dataclasses.replace(runs[0], after=True, outputs=coarse)], min_kl=0.01
    )
    assert (same["CPU"].state, moved["CPU"].state) == ("unchanged", "changed")


def test_logits_that_are_no_numbers_are_counted_and_a_tiny_vocabulary_kept_whole() -> None:
    ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    rest: list[float] = []
    rows = np.array([[2.0, 1.0, 0.0, -1.0], [np.nan, 1.0, np.inf, 0.0]])
    assert reduce_rows(rows, ids, logprobs, rest) == 1  # the second row
    # four tokens, fewer than TOP_K: all of them, likeliest first, nothing left over
    assert ids[0] == [0, 1, 2, 3] and rest[0] == -1e4
    total = math.log(sum(math.exp(x) for x in (2.0, 1.0, 0.0, -1.0)))
    assert logprobs[0] == pytest.approx([round(x - total, 5) for x in (2.0, 1.0, 0.0, -1.0)])
    assert ids[1][:2] == [1, 3]  # NaN and inf taken as the least logit
    assert all(-1e4 <= lp <= 0 for lp in logprobs[1])


def test_a_sweep_asked_for_no_outputs_takes_none(tiny_llama: Path) -> None:
    report = _sweep(tiny_llama, SPEC.model_copy(update={"outputs": False}))
    assert report.status == "ok" and report.outputs is None


def test_the_registry_keeps_the_fingerprint_and_says_what_it_holds(
    gemma: Path, live_registry: LiveRegistry
) -> None:
    report = _sweep(gemma)
    assert report.outputs is not None
    with live_registry.client(live_registry.token("cpu-node")) as client:
        assert post_report(client, report).status_code == 201
    with httpx.Client(base_url=live_registry.url) as client:
        run = client.get(f"/v1/runs/{report.run_id}").json()
    assert run["outputs"] == {
        "text_version": TEXT_VERSION,
        "positions": POSITIONS,
        "top_k": TOP_K,
        "seconds": pytest.approx(report.outputs.seconds),
    }
