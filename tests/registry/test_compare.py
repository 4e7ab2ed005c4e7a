"""Build comparison and the rollout verdict (GET /v1/compare) on seeded fleets, both
databases: a build that slows one hardware class holds naming it, noise alone goes, too
few runs are unknown with the runs needed; and the pure judgement beneath."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, update

from fleetbench.contract import wire
from fleetbench.registry import crud, tokens
from fleetbench.registry.compare.rollouts import RolloutRequest, watch_rollout
from fleetbench.registry.compare.rules import (
    ClassFigures,
    CompareSettings,
    ListedCell,
    NodeSummary,
    PointKey,
    SideFigures,
    compare_cell,
    fleet_verdict,
    runs_needed,
)
from fleetbench.registry.db import session_factory, write_transaction
from fleetbench.registry.hardware import hardware_class
from fleetbench.registry.ingest import ingest_batch
from fleetbench.registry.models import RolloutWatch
from fleetbench.registry.notify import WebhookNotifier
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    DAY0,
    LiveRegistry,
    Receiver,
    make_report,
    make_serving_report,
    post_report,
)

OLD, NEW = 11429, 11500


def gpu(name: str, node: str, driver: str = "550.54.15") -> wire.HardwareFingerprint:
    return wire.HardwareFingerprint(
        hash=f"{node}-{driver}".encode().hex().ljust(64, "0")[:64],
        data={
            "probes": {
                "nvidia": {
                    "driver_version": driver,
                    "gpus": [{"name": name, "memory_bytes": 80 * 2**30}],
                }
            }
        },
    )


H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
FLEET = {f"h100-{i}": H100 for i in range(3)} | {f"a100-{i}": A100 for i in range(3)}
Slowdown = Callable[[str, int, int], float]  # (node, build, B) -> factor on its speeds


def seed(
    engine: Engine,
    fleet: Mapping[str, str],
    runs: Mapping[int, int],
    slowdown: Slowdown = lambda node, build, b: 1.0,
    *,
    noise: float = 0.01,
    seed: int = 7,
    first_hour: int = 0,
    contention: wire.Contention | None = None,
) -> None:
    """`runs[build]` runs of each build on each node, interleaved in time from
    `first_hour`, each point's speeds scaled by the slowdown and by 1% noise (seeded);
    `contention`: what else used the nodes while they ran."""
    rng = random.Random(seed)
    batch: list[tuple[wire.RunReport, int]] = []
    with session_factory(engine)() as session, write_transaction(session):
        for node, card in fleet.items():
            if crud.find_node(session, node) is None:
                tokens.create_node_token(session, node_name=node, labels={})
            found = crud.find_node(session, node)
            assert found is not None
            hour = first_hour
            for build, count in runs.items():
                for _ in range(count):
                    hour += 1
                    table = [
                        (b, pp * slowdown(node, build, b) * (1 + rng.gauss(0, noise)),
                         tg * slowdown(node, build, b) * (1 + rng.gauss(0, noise)))
                        for b, pp, tg in ARTICLE_TABLE
                    ]  # fmt: skip
                    report = make_report(
                        node=node,
                        table=table,
                        build_number=build,
                        started_at=DAY0 + timedelta(hours=hour),
                        hardware=gpu(card, node),
                        contention=contention,
                    )
                    batch.append((report, found.id))
        for stored in ingest_batch(session, batch):
            assert not isinstance(stored, Exception), stored
        session.commit()


def compare(registry: LiveRegistry, **query: Any) -> dict[str, Any]:
    params = {"model": ARTICLE_MODEL, "from_build": f"b{OLD}", "to_build": str(NEW)} | query
    with registry.client() as client:
        response = client.get("/v1/compare", params=params)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def h100_slower_at_8_and_up(node: str, build: int, b: int) -> float:
    return 0.88 if build == NEW and node.startswith("h100") and b >= 8 else 1.0


def test_a_build_slowing_one_class_by_12_percent_at_b_8_and_up_holds_naming_it(
    live_registry: LiveRegistry,
) -> None:
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 3}, h100_slower_at_8_and_up)
    answer = compare(live_registry)
    assert answer["verdict"] == "hold"
    assert answer["from_builds"] == [f"llama.cpp b{OLD} Metal"]
    assert answer["to_builds"] == [f"llama.cpp b{NEW} Metal"]
    classes = {c["hardware_class"]: c for c in answer["classes"]}
    assert (classes[H100]["verdict"], classes[A100]["verdict"]) == ("hold", "go")
    assert H100 in answer["reason"] and A100 not in answer["reason"]
    held = {(p["metric"], p["b"]) for p in classes[H100]["points"] if p["held"]}
    assert held == {(m, b) for m in ("s_tg", "s_pp") for b in (8, 16, 32)}
    for point in classes[H100]["points"]:
        if point["held"]:
            assert 9 < point["worse_pct"] < 15 and point["nodes"] == 3
            assert point["worst_node"].startswith("h100")
    assert "12." in classes[H100]["reason"] or "11." in classes[H100]["reason"]
    assert "B=" in classes[H100]["reason"]
    # each node compared point by point, with an interval around the ratio
    nodes = {n["node"]: n for n in answer["nodes"]}
    assert set(nodes) == set(FLEET)
    point = next(p for p in nodes["h100-0"]["points"] if (p["metric"], p["b"]) == ("s_tg", 16))
    assert point["ratio_low"] < point["ratio"] < point["ratio_high"]
    assert 0.83 < point["ratio"] < 0.93 and point["beyond_detection"]
    assert (point["runs_from"], point["runs_to"]) == (3, 3)
    assert answer["not_compared"] == []
    # a fleet lists its worst nodes first, as many as asked; the verdict weighs them all
    first = compare(live_registry, limit=2)
    assert first["nodes_compared"] == 6 and first["verdict"] == "hold"
    assert [n["node"][:4] for n in first["nodes"]] == ["h100", "h100"]


def test_noise_alone_goes(live_registry: LiveRegistry) -> None:
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 3})
    answer = compare(live_registry)
    assert answer["verdict"] == "go", answer["reason"]
    assert {c["verdict"] for c in answer["classes"]} == {"go"}
    assert all(not p["held"] for c in answer["classes"] for p in c["points"])
    assert H100 in answer["reason"] and A100 in answer["reason"]


def test_runs_measured_under_contention_add_no_noise(live_registry: LiveRegistry) -> None:
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 3})
    before = compare(live_registry)
    busy = wire.Contention(seconds=60, other_cpu_share=0.9, reason="others used 90% of the CPUs")
    # two runs of the new build at a third of the speed, each measured beside another job
    seed(live_registry.engine, FLEET, {NEW: 2}, lambda *_: 0.3, first_hour=100, contention=busy)
    after = compare(live_registry)
    assert after["verdict"] == before["verdict"] == "go"
    assert after["classes"] == before["classes"]


def test_too_few_runs_is_unknown_with_the_runs_needed(live_registry: LiveRegistry) -> None:
    seed(live_registry.engine, {"h100-0": H100}, {OLD: 3, NEW: 1}, h100_slower_at_8_and_up)
    answer = compare(live_registry)
    assert answer["verdict"] == "unknown"
    [summary] = answer["classes"]
    assert summary["runs_needed"] is not None and summary["runs_needed"] >= 1
    assert f"{summary['runs_needed']} more run" in answer["reason"]
    assert "fewer than 2 runs of each build" in answer["reason"]
    # The runs asked for, and the class is judged: the slowdown holds it.
    more = {NEW: summary["runs_needed"]}
    seed(live_registry.engine, {"h100-0": H100}, more, h100_slower_at_8_and_up, seed=9)
    assert compare(live_registry)["verdict"] == "hold"


def test_nodes_with_one_build_or_changed_hardware_are_listed_as_not_compared(
    live_registry: LiveRegistry,
) -> None:
    seed(live_registry.engine, {"h100-0": H100, "old-only": H100}, {OLD: 2})
    seed(live_registry.engine, {"h100-0": H100, "new-only": A100}, {NEW: 2}, seed=8)
    answer = compare(live_registry)
    nodes = {n["node"] for n in answer["nodes"]}
    reasons = {n["node"]: n["reason"] for n in answer["not_compared"]}
    assert nodes == {"h100-0"}
    assert reasons == {
        "new-only": f"no run of llama.cpp b{OLD} Metal on it",
        "old-only": "it has not run the new build",
    }
    classes = {c["hardware_class"]: c for c in answer["classes"]}
    assert classes[A100]["verdict"] == "unknown" and classes[A100]["nodes_compared"] == 0
    assert "no node ran both builds" in classes[A100]["reason"]


def test_serving_runs_compare_the_servers_ttft_and_per_user_speed(
    live_registry: LiveRegistry,
) -> None:
    """Two llama-server builds on two nodes: the new one's first token comes 30% later at
    every concurrency on both, per-user speed unchanged: hold on the TTFT p90, longer."""
    rng = random.Random(3)
    for node in ("srv-a", "srv-b"):
        token = live_registry.token(node)
        with live_registry.client(token) as client:
            for build, ttft in ((7100, 200.0), (7200, 260.0)):
                for run in range(3):
                    points = [
                        (c, 40.0 * c, 20.0 * (1 + rng.gauss(0, 0.01)),
                         ttft * c * (1 + rng.gauss(0, 0.01)))
                        for c in (1, 2, 4)
                    ]  # fmt: skip
                    report = make_serving_report(
                        node=node,
                        points=points,
                        build_number=build,
                        started_at=DAY0 + timedelta(hours=build - 7000 + run),
                        hardware=gpu(H100, node),
                    )
                    assert post_report(client, report).status_code == 201
    with live_registry.client() as client:
        response = client.get(
            "/v1/compare",
            params={"model": "gemma-3-270m", "from_build": "b7100", "to_build": "b7200",
                    "kind": "serving"},
        )  # fmt: skip
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["verdict"] == "hold" and answer["kind"] == "serving"
    assert answer["reason"].startswith(f"{H100}: TTFT p90 at B=")
    assert "longer" in answer["reason"]
    [summary] = answer["classes"]
    held = {(p["metric"], p["b"]) for p in summary["points"] if p["held"]}
    assert held == {("ttft_ms_p90", c) for c in (1, 2, 4)}
    ttft = [p for p in summary["points"] if p["metric"] == "ttft_ms_p90"]
    assert all(28 < p["worse_pct"] < 32 for p in ttft)
    node = answer["nodes"][0]
    assert node["settings"] == (
        "kind=llama-server slots=4 ctx_per_slot=4096 prompt_tokens=512 gen_tokens=128 "
        "on llama.cpp llama-server"
    )
    assert {p["runs_from"] for p in node["points"]} == {3}


def test_an_unknown_model_is_404_and_a_build_no_run_has_says_so(
    live_registry: LiveRegistry,
) -> None:
    seed(live_registry.engine, {"h100-0": H100}, {OLD: 2})
    with live_registry.client() as client:
        missing = client.get(
            "/v1/compare", params={"model": "nope", "from_build": "1", "to_build": "2"}
        )
        assert missing.status_code == 404 and "nope" in missing.json()["detail"]
        blank = client.get(
            "/v1/compare", params={"model": ARTICLE_MODEL, "from_build": "", "to_build": "2"}
        )
        assert blank.status_code == 422
    answer = compare(live_registry, to_build="b99999")
    assert answer["verdict"] == "unknown"
    assert answer["reason"] == "no run of build 'b99999' is stored"
    # digits str.isdigit() takes and int() does not: a build no run has, not a 500
    assert compare(live_registry, from_build="b\u00b2")["verdict"] == "unknown"
    same = compare(live_registry, from_build=str(OLD), to_build=f"llama.cpp b{OLD} Metal")
    assert same["verdict"] == "unknown"
    assert same["reason"] == (
        f"no run of build '{OLD}' nor of 'llama.cpp b{OLD} Metal' is stored apart from "
        f"llama.cpp b{OLD} Metal, which '{OLD}' and 'llama.cpp b{OLD} Metal' both name"
    )
    assert [n["node"] for n in answer["not_compared"]] == []


def test_a_watched_rollout_says_once_on_the_webhook_when_its_verdict_changes(
    live_registry: LiveRegistry, receiver: Receiver
) -> None:
    """Unknown while the canaries have one run of the new build; hold once they have three;
    the change POSTed once, with a link to the comparison; nothing new, nothing sent."""
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 1}, h100_slower_at_8_and_up)
    admin = live_registry.scoped_token("admin", name="ops")
    body = {"model": ARTICLE_MODEL, "from_build": f"b{OLD}", "to_build": str(NEW)}
    with live_registry.client(admin) as client:
        made = client.post("/v1/rollouts", json=body)
        assert made.status_code == 201, made.text
        watch = made.json()
        assert (watch["verdict"], watch["kind"]) == ("unknown", "offline")
        assert watch["created_by"].startswith("ops (token ")
        assert "more run" in watch["reason"]
        again = client.post("/v1/rollouts", json=body)
        assert (again.status_code, again.json()["id"]) == (200, watch["id"])
        spelt = client.post("/v1/rollouts", json=body | {"model": ARTICLE_MODEL.lower() + ".gguf"})
        assert (spelt.status_code, spelt.json()["id"]) == (200, watch["id"])  # one model, one watch
        same = client.post("/v1/rollouts", json=body | {"to_build": f"b{OLD}"})
        assert same.status_code == 422 and "the same build" in same.text
        assert client.post("/v1/rollouts", json=body | {"model": "nope"}).status_code == 404
        assert client.post("/v1/rollouts", json=body | {"kind": "both"}).status_code == 422
    with live_registry.client() as client:  # the reader's view: open reads here
        assert client.post("/v1/rollouts", json=body).status_code == 401
    notifier = WebhookNotifier(
        session_factory(live_registry.engine),
        url=receiver.url,
        public_url="http://registry.example:8787",
        compare_settings=CompareSettings(),
    )
    try:
        assert notifier.deliver_due() == 0  # the first verdict is the admin's answer
        seed(live_registry.engine, FLEET, {NEW: 2}, h100_slower_at_8_and_up, seed=8)
        assert notifier.deliver_due() == 1
        assert notifier.deliver_due() == 0  # sent once; no run since: not checked again
    finally:
        notifier.stop()
    [event] = receiver.bodies
    assert event["event"] == "rollout_verdict"
    rollout = event["rollout"]
    assert (rollout["id"], rollout["verdict"], rollout["previous_verdict"]) == (
        watch["id"],
        "hold",
        "unknown",
    )
    assert H100 in rollout["reason"]
    assert event["url"] == (
        f"http://registry.example:8787/compare?model={ARTICLE_MODEL}&from_build=b{OLD}"
        f"&to_build={NEW}&kind=offline"
    )
    with live_registry.client() as client:
        [listed] = client.get("/v1/rollouts").json()["data"]
        assert (listed["verdict"], listed["notified_at"] is not None) == ("hold", True)
    with live_registry.client(admin) as client:
        assert client.delete(f"/v1/rollouts/{watch['id']}").status_code == 204
        assert client.delete(f"/v1/rollouts/{watch['id']}").status_code == 404
        assert client.get("/v1/rollouts").json() == {"data": [], "count": 0}


def test_a_change_made_while_the_one_before_is_delivered_is_sent_too(
    live_registry: LiveRegistry, receiver: Receiver
) -> None:
    """Another registry process records a newer verdict while this one delivers the older:
    the delivery's answer marks only what it sent, and the newer change goes next."""
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 1}, h100_slower_at_8_and_up)
    sessions = session_factory(live_registry.engine)
    with sessions() as session:
        [model] = crud.find_models(session, ARTICLE_MODEL)
        request = RolloutRequest(model=ARTICLE_MODEL, from_build=str(OLD), to_build=str(NEW))
        watch, _ = watch_rollout(session, request, [model], by="ops", settings=CompareSettings())
        watch_id = watch.id
    seed(live_registry.engine, FLEET, {NEW: 2}, h100_slower_at_8_and_up, seed=8)

    def newer_verdict() -> None:
        receiver.meanwhile = None
        with sessions() as session, write_transaction(session):
            session.execute(
                update(RolloutWatch)
                .where(RolloutWatch.id == watch_id)
                .values(
                    verdict="go",
                    previous_verdict="hold",
                    changed_at=datetime.now(UTC),
                    notified_at=None,
                    notify_after=None,
                    notify_attempts=0,
                )
            )
            session.commit()

    receiver.meanwhile = newer_verdict
    notifier = WebhookNotifier(
        sessions, url=receiver.url, public_url="http://x", compare_settings=CompareSettings()
    )
    try:
        # the hold sent but not counted as the watch's news, then the go in the same pass
        assert notifier.deliver_due() == 1
    finally:
        notifier.stop()
    assert [b["rollout"]["verdict"] for b in receiver.bodies] == ["hold", "go"]


def test_the_cli_prints_the_verdict_as_a_table_or_markdown_and_fails_on_hold(
    database_url: str, engine: Engine
) -> None:
    seed(engine, FLEET, {OLD: 3, NEW: 3}, h100_slower_at_8_and_up)
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": database_url, "COLUMNS": "300"}
    asked = ["--model", ARTICLE_MODEL, "--from-build", f"b{OLD}", "--to-build", f"b{NEW}"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleetbench.registry.cli", "compare", *asked, *args],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    table, markdown = cli(), cli("--markdown")
    assert table.returncode == 1 and markdown.returncode == 1, table.stderr  # hold
    assert f"verdict: hold: {H100}" in table.stdout
    assert "h100-0" in table.stdout and "worse" in table.stdout
    lines = markdown.stdout.splitlines()
    assert (
        lines[0]
        == f"## {ARTICLE_MODEL}: llama.cpp b{OLD} Metal -> llama.cpp b{NEW} Metal (offline)"
    )
    assert lines[2].startswith(f"**Verdict: hold**: {H100}: S_TG at B=")
    assert f"| {A100} | go | 3 |" in markdown.stdout
    rows = [line for line in lines if line.startswith("| h100-1 | S_TG |")]
    assert [row.split(" | ")[4] for row in rows] == ["1", "2", "4", "8", "16", "32"]
    missing = subprocess.run(
        [sys.executable, "-m", "fleetbench.registry.cli", "compare", "--model", "nope",
         "--from-build", "1", "--to-build", "2"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # no such model: a usage error (2), neither hold (1) nor unknown (3)
    assert missing.returncode == 2 and "model 'nope' not found" in missing.stderr
    unknown = cli("--to-build", "b99999")  # a typo, or no canary has run it: not a go
    assert unknown.returncode == 3 and "verdict: unknown" in unknown.stdout


# The pure judgement.

SETTINGS = CompareSettings()


def cell(before: tuple[int, float], after: tuple[int, float], noise: float = 0.03) -> ListedCell:
    key = PointKey("s_tg", 512, 128, 8)
    return ListedCell("gpu-1", key, SideFigures(*before), SideFigures(*after), noise)


def test_a_cells_interval_and_detectable_change_narrow_with_runs() -> None:
    few = compare_cell(cell((2, 100), (2, 95)), SETTINGS)
    many = compare_cell(cell((20, 100), (20, 95)), SETTINGS)
    assert few.ratio == pytest.approx(0.95) and many.ratio == pytest.approx(0.95)
    assert few.high - few.low > many.high - many.low
    assert few.low < 0.95 < few.high
    assert few.detectable > many.detectable >= SETTINGS.min_change
    assert few.worse == pytest.approx(0.05)
    ttft = ListedCell("gpu-1", PointKey("ttft_ms_p90", 512, 128, 4), SideFigures(3, 200),
                      SideFigures(3, 240), 0.01)  # fmt: skip
    assert compare_cell(ttft, SETTINGS).worse == pytest.approx(0.2)  # longer is worse


def test_a_slowdown_beyond_noise_holds_though_the_runs_could_miss_a_smaller_one() -> None:
    """8% slower on 4 runs of each build at 3% noise: 3.8 standard errors out, so it holds;
    the 9.3% these runs would find with 95% probability decides only `unknown`."""
    listed = compare_cell(cell((4, 100), (4, 92)), SETTINGS)
    assert listed.high < 1  # the interval clears no change
    node = NodeSummary("gpu-1", "H100", "H100 (driver 1)", "n_ctx=4096", 4, 4, 4, 4, True, 0.03)
    figures = ClassFigures(
        PointKey("s_tg", 512, 128, 8), "H100", 1, math.log(0.92), 0.03**2 * (1 / 4 + 1 / 4),
        "gpu-1", math.log(0.92),
    )  # fmt: skip
    verdict = fleet_verdict([node], [figures], SETTINGS, {})
    assert verdict.verdict == "hold", verdict.reason
    assert verdict.reason.startswith("H100: s_tg at B=8 (PP 512, TG 128) 8.0% slower")


def test_figures_no_interval_can_hold_stay_numbers_not_a_crash() -> None:
    wide = compare_cell(cell((2, 1.0), (2, 1.0), noise=1000.0), SETTINGS)
    assert 1e100 < wide.high < 1e200 and 1e-200 < wide.low < 1e-100
    far = compare_cell(cell((2, 1e12), (2, 1e-300)), SETTINGS)
    assert far.low <= far.ratio <= far.high < 1e-200 and far.worse == pytest.approx(1)


def test_runs_needed_falls_with_more_nodes_and_less_noise() -> None:
    assert runs_needed(0.03, 1, SETTINGS) >= runs_needed(0.03, 6, SETTINGS)
    assert runs_needed(0.01, 1, SETTINGS) <= runs_needed(0.05, 1, SETTINGS)
    assert runs_needed(0.001, 1, SETTINGS) == SETTINGS.min_runs
    assert runs_needed(10.0, 1, SETTINGS) == 50


def test_a_hardware_class_is_its_cards_whatever_the_driver() -> None:
    assert hardware_class("2x NVIDIA H100 80GB HBM3 (driver 550.54.15)") == (
        "2x NVIDIA H100 80GB HBM3"
    )
    assert hardware_class("Apple M4 Pro, 24 GiB") == "Apple M4 Pro, 24 GiB"
    assert hardware_class(None) is None
