"""Faster but wrong is not a go (GET /v1/compare, both databases): a build whose model outputs on
the reference text moved beyond its class's floor holds the rollout naming the class, the KL
divergence, the top-token agreement and the worst node, even where it is no slower; outputs
that moved by no more than the nodes of one build differ among themselves go; and the pure
verdict beneath, by hand."""

from __future__ import annotations

import math
from datetime import timedelta

from fleetbench.contract.outputs import OutputDifference, OutputFingerprint
from fleetbench.contract.wire import RunReport
from fleetbench.registry.compare.outputs import RunOutputs, judge_outputs
from tests.factories import (
    ARTICLE_MODEL,
    DAY0,
    LiveRegistry,
    agent,
    make_report,
    make_serving_report,
    post_report,
)
from tests.registry.test_compare import A100, H100, NEW, OLD, compare, gpu

POSITIONS = 40


def fingerprint(top: float = 0.6, *, wrong_every: int = 0) -> OutputFingerprint:
    """Each position's likeliest token `100 + i` at probability `top`, the next at 0.3; every
    `wrong_every`th position (0: none) the two swapped: a kernel wrong on some tokens."""
    ids, logprobs, rest = [], [], []
    for i in range(POSITIONS):
        first, second = 100 + i, 500 + i
        if wrong_every and i % wrong_every == 0:
            first, second = second, first
        ids.append([first, second])
        logprobs.append([math.log(top), math.log(0.3)])
        rest.append(math.log(1 - top - 0.3))
    return OutputFingerprint(n_vocab=1000, ids=ids, logprobs=logprobs, rest=rest)


def _post(registry: LiveRegistry, report: RunReport) -> None:
    with registry.client(registry.token(report.node)) as client:
        assert post_report(client, report).status_code == 201


def seed(registry: LiveRegistry, outputs: dict[tuple[str, int], OutputFingerprint]) -> None:
    """Two runs of each build on each node, the same speeds, with the outputs given."""
    hour = 0
    for (node, build), taken in outputs.items():
        card = A100 if node.startswith("a100") else H100
        for _ in range(2):
            hour += 1
            report = make_report(
                node=node,
                build_number=build,
                started_at=DAY0 + timedelta(hours=hour),
                hardware=gpu(card, node),
            )
            _post(registry, report.model_copy(update={"outputs": taken}))


def test_outputs_changed_beyond_the_floor_hold_a_build_no_slower(
    live_registry: LiveRegistry,
) -> None:
    # the H100s' nodes differ a little on one build (0.60 against 0.61: their floor); the new
    # build swaps the top two tokens at every fourth position on h100-1
    outputs = {
        ("h100-0", OLD): fingerprint(0.6),
        ("h100-1", OLD): fingerprint(0.61),
        ("h100-0", NEW): fingerprint(0.6),
        ("h100-1", NEW): fingerprint(0.61, wrong_every=4),
        ("a100-0", OLD): fingerprint(0.6),
        ("a100-0", NEW): fingerprint(0.6),
    }
    seed(live_registry, outputs)
    answer = compare(live_registry)
    assert answer["verdict"] == "hold"
    classes = {c["hardware_class"]: c for c in answer["classes"]}
    h100, a100 = classes[H100], classes[A100]
    assert (h100["verdict"], a100["verdict"]) == ("hold", "go")
    assert not any(p["held"] for p in h100["points"])  # no slower: held on its outputs alone
    found = h100["outputs"]
    assert (found["state"], found["nodes"], found["worst_node"]) == ("changed", 2, "h100-1")
    # 10 of 40 positions swapped: 0.61 log(0.61 / 0.3) + 0.3 log(0.3 / 0.61) each
    swapped = 0.61 * math.log(0.61 / 0.3) + 0.3 * math.log(0.3 / 0.61)
    assert abs(found["mean_kl"] - swapped / 4) < 1e-3 and found["top_token_agreement"] == 0.75
    assert abs(found["p99_kl"] - swapped) < 1e-3
    assert 0 < found["floor_kl"] < 0.001  # 0.60 against 0.61 on the old build
    assert "outputs changed" in answer["reason"] and "h100-1" in answer["reason"]
    assert "top token the same at 75.0% of 40 positions" in answer["reason"]
    assert a100["outputs"]["state"] == "unchanged"

    markdown = agent(
        "compare", "--model", ARTICLE_MODEL, "--from-build", f"b{OLD}", "--to-build", str(NEW),
        "--markdown", "--registry", live_registry.url,
    )  # fmt: skip
    assert markdown.returncode == 1, markdown.stderr
    assert "outputs changed: KL divergence mean" in markdown.stdout
    assert "outputs unchanged over 1 node" in markdown.stdout  # the A100s'


def test_outputs_moved_within_the_floor_go(live_registry: LiveRegistry) -> None:
    outputs = {
        ("h100-0", OLD): fingerprint(0.6),
        ("h100-1", OLD): fingerprint(0.62),
        ("h100-0", NEW): fingerprint(0.61),
        ("h100-1", NEW): fingerprint(0.62),
    }
    seed(live_registry, outputs)
    answer = compare(live_registry)
    assert answer["verdict"] == "go", answer["reason"]
    [summary] = answer["classes"]
    assert summary["outputs"]["state"] == "within the floor"
    assert summary["outputs"]["mean_kl"] <= 2 * summary["outputs"]["floor_kl"]


def _run(node: str, after: bool, taken: OutputFingerprint) -> RunOutputs:
    return RunOutputs(node, "H100", 1, "llama.cpp CUDA", after, taken)


def test_the_verdict_by_hand() -> None:
    same = judge_outputs(
        [_run("a", False, fingerprint()), _run("a", True, fingerprint())], min_kl=0.01
    )
    assert same["H100"].state == "unchanged" and same["H100"].floor_kl == 0.0
    # no floor (one node, one run a build): a change under min_kl is within it, above not
    small = judge_outputs(
        [_run("a", False, fingerprint(0.6)), _run("a", True, fingerprint(0.62))], min_kl=0.01
    )
    assert small["H100"].state == "within the floor"
    wrong = judge_outputs(
        [_run("a", False, fingerprint()), _run("a", True, fingerprint(wrong_every=2))],
        min_kl=0.01,
    )
    assert wrong["H100"].state == "changed"
    assert isinstance(wrong["H100"].worst, OutputDifference)
    assert wrong["H100"].worst.top_token_agreement == 0.5
    # other model files or runners never compare: no verdict
    other = RunOutputs("a", "H100", 2, "llama.cpp CUDA", True, fingerprint(wrong_every=2))
    assert judge_outputs([_run("a", False, fingerprint()), other], min_kl=0.01) == {}


def test_the_floor_lets_through_what_the_old_build_itself_varies_by() -> None:
    # the old build's two nodes differ by the mean KL of 0.60 against 0.66; the new build
    # moves node a by as much: within the floor though above min_kl, and changed without it
    old = [_run("a", False, fingerprint(0.6)), _run("b", False, fingerprint(0.66))]
    new = [_run("a", True, fingerprint(0.66)), _run("b", True, fingerprint(0.66))]
    moved = judge_outputs([*old, *new], min_kl=1e-4)["H100"]
    assert moved.worst.mean_kl > 1e-4 and moved.floor_kl == moved.worst.mean_kl
    assert (moved.state, moved.nodes, moved.worst_node) == ("within the floor", 2, "a")
    alone = judge_outputs([old[0], new[0]], min_kl=1e-4)["H100"]
    assert (alone.state, alone.floor_kl) == ("changed", 0.0)


def test_a_few_positions_moved_far_change_the_outputs_whatever_the_mean() -> None:
    # one position in forty swapped: the mean stays under min_kl, the p99 does not
    moved = judge_outputs(
        [_run("a", False, fingerprint()), _run("a", True, fingerprint(wrong_every=40))],
        min_kl=0.01,
    )["H100"]
    assert moved.worst.mean_kl < 0.01 < 0.1 < moved.worst.p99_kl
    assert moved.state == "changed" and "p99" in moved.reason


def test_logits_that_are_no_numbers_change_the_outputs() -> None:
    broken = fingerprint().model_copy(update={"non_finite": 12})
    verdict = judge_outputs(
        [_run("a", False, fingerprint()), _run("a", True, broken)], min_kl=0.01
    )["H100"]
    assert verdict.state == "changed"
    assert verdict.reason == "outputs changed: 12 positions' logits are no numbers (NaN, inf) on a"


def test_runs_of_another_offload_never_compare(live_registry: LiveRegistry) -> None:
    # the old build measured with every layer on the GPU, the new one on the CPU (-ngl 0):
    # their outputs differ as two devices' do, not as two builds'
    for hour, (build, layers, taken) in enumerate(
        [(OLD, -1, fingerprint()), (NEW, 0, fingerprint(wrong_every=2))]
    ):
        report = make_report(
            node="h100-0",
            build_number=build,
            started_at=DAY0 + timedelta(hours=hour),
            hardware=gpu(H100, "h100-0"),
        )
        settings = report.settings.model_copy(update={"n_gpu_layers": layers})
        _post(live_registry, report.model_copy(update={"outputs": taken, "settings": settings}))
    [summary] = compare(live_registry)["classes"]
    assert summary["outputs"] is None


def test_serving_runs_compare_their_servers_outputs(live_registry: LiveRegistry) -> None:
    """`kind=serving` judges the fingerprints serving sweeps took from their llama-server: the
    same speed, the new server's top two tokens swapped at every second position."""
    for hour, (build, taken) in enumerate(
        [(7100, fingerprint()), (7100, fingerprint()), (7200, fingerprint(wrong_every=2))] * 2
    ):
        report = make_serving_report(
            node="h100-0",
            points=[(c, 40.0 * c, 20.0, 100.0 * c) for c in (1, 2, 4)],
            build_number=build,
            started_at=DAY0 + timedelta(hours=hour),
            hardware=gpu(H100, "h100-0"),
            outputs=taken,
        )
        _post(live_registry, report)
    with live_registry.client() as client:
        params = {"model": "gemma-3-270m", "from_build": "b7100", "to_build": "b7200"}
        served = client.get("/v1/compare", params={**params, "kind": "serving"}).json()
        offline = client.get("/v1/compare", params=params).json()
    [summary] = served["classes"]
    assert summary["outputs"]["state"] == "changed" and served["verdict"] == "hold"
    assert summary["outputs"]["top_token_agreement"] == 0.5
    assert summary["outputs"]["floor_kl"] == 0  # two runs of the old server, the same outputs
    assert "outputs changed" in served["reason"]
    assert offline["classes"] == []  # no offline run: the servers' outputs are not its
