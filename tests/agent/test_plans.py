"""Central sweep plans on real agents and a real registry over loopback: nodes with
different labels pull different plans, a change reaches every node at its next poll, a node
started while the registry is down runs the plans it cached, a node without the model says
why it skips, and an admin's sweep-now runs the plan and delivers the run."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetbench.agent.daemon import Daemon
from fleetbench.agent.plans import resolve_plan
from fleetbench.agent.runners.llama_cpp_python import binding_version
from fleetbench.contract.plans import PlanVersion
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.routes.nodes import SKIP_HIDDEN
from tests.factories import LiveRegistry, a_daemon, free_port, running_registry

TINY_GRID = {"npp": [8], "ntg": [4], "npl": [1], "repeats": 1}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _save(registry: LiveRegistry, admin: str, name: str, **body: Any) -> httpx.Response:
    with registry.client(admin) as client:
        return client.put(f"/v1/plans/{name}", json={"cron": "0 3 * * *", **body})


def _nodes(registry: LiveRegistry) -> dict[str, dict[str, Any]]:
    """The nodes as a reader token sees them (skips with their reasons)."""
    with registry.client(registry.scoped_token("reader")) as client:
        return {n["name"]: n for n in client.get("/v1/nodes").json()["data"]}


def _daemon(
    tmp_path: Path, registry: LiveRegistry, node: str, model_dirs: list[Path], **labels: str
) -> Daemon:
    """A node of the registry whose plans may load models from `model_dirs`."""
    daemon = a_daemon(
        tmp_path / node,
        node=node,
        registry_url=registry.url,
        token=registry.token(node, **labels),
        jitter_s=0,
        plan_model_dirs=model_dirs,
    )
    daemon.schedule()  # the scheduler, not started: the test calls the jobs
    return daemon


def test_nodes_pull_the_plans_their_labels_pick_and_each_change_at_the_next_poll(
    live_registry: LiveRegistry, tmp_path: Path, tiny_llama: Path
) -> None:
    admin = live_registry.scoped_token("admin", name="ops")
    model = {"path": str(tiny_llama), "sha256": _sha256(tiny_llama)}
    for pool in ("a", "b"):
        saved = _save(live_registry, admin, f"pool-{pool}", labels={"pool": pool}, model=model)
        assert saved.status_code == 201, saved.text
    east = _daemon(tmp_path, live_registry, "east", [tiny_llama.parent], pool="a")
    west = _daemon(tmp_path, live_registry, "west", [tiny_llama.parent], pool="b")
    for daemon in (east, west):
        daemon.poll_plans()
    assert list(east.planned) == ["pool-a"] and list(west.planned) == ["pool-b"]
    # polled again unchanged: a bodiless 304, for the tag as sent and as a proxy weakens it
    etag = east.plan_cache.load()[0]  # type: ignore[index]
    with live_registry.client(east.settings.current_token()) as client:
        for tag in (etag, f"W/{etag}"):
            again = client.get(
                "/v1/agent/plans",
                headers={"If-None-Match": tag},
                params={"kind": ["offline", "serving"]},  # as agents ask
            )
            assert (again.status_code, again.content) == (304, b"")
    assert east.planned["pool-a"].plan.settings.repeats == "auto"
    assert east.scheduler.get_job("sweep:plan:pool-a") is not None
    assert west.scheduler.get_job("sweep:plan:pool-a") is None
    nodes = _nodes(live_registry)
    [east_plan] = nodes["east"]["plans"]
    assert (east_plan["name"], east_plan["version"], east_plan["skipped"]) == ("pool-a", 1, None)
    assert east_plan["next_run_at"].endswith("03:00:00Z")
    assert nodes["east"]["missed_schedule"] is False

    # one plan for both, then changed: each node has the change after one poll
    both = {"nodes": ["east", "west"], "model": model, "settings": TINY_GRID}
    assert _save(live_registry, admin, "both", **both).status_code == 201
    assert _save(live_registry, admin, "both", **both).status_code == 200  # the same: no v2
    changed = _save(live_registry, admin, "both", **{**both, "cron": "30 4 * * *"})
    assert (changed.status_code, changed.json()["version"]) == (201, 2)
    assert changed.json()["created_by"].startswith("ops (token ")
    for daemon in (east, west):
        daemon.poll_plans()
        assert daemon.planned["both"].plan.version == 2
        trigger = str(daemon.scheduler.get_job("sweep:plan:both").trigger)
        assert "hour='4', minute='30'" in trigger
    assert {p["name"]: p["version"] for p in _nodes(live_registry)["west"]["plans"]} == {
        "both": 2,
        "pool-b": 1,
    }
    with live_registry.client() as client:
        history = client.get("/v1/plans/both/versions").json()
    assert [v["version"] for v in history["data"]] == [2, 1]
    assert [v["cron"] for v in history["data"]] == ["30 4 * * *", "0 3 * * *"]

    # retired: no node runs it, and every version stays on record
    with live_registry.client(admin) as client:
        assert client.delete("/v1/plans/both").json()["enabled"] is False
    east.poll_plans()
    assert "both" not in east.planned and east.scheduler.get_job("sweep:plan:both") is None


def test_an_admins_sweep_now_runs_the_plan_once_and_delivers_the_run(
    live_registry: LiveRegistry, tmp_path: Path, tiny_llama: Path
) -> None:
    admin = live_registry.scoped_token("admin")
    plan = {"model": {"path": str(tiny_llama), "name": "tiny"}, "settings": TINY_GRID}
    assert _save(live_registry, admin, "nightly", **plan).status_code == 201
    node = _daemon(tmp_path, live_registry, "gpu-1", [tiny_llama.parent])
    node.poll_plans()
    with live_registry.client(admin) as client:
        asked = client.post("/v1/plans/sweep-now/gpu-1")
    assert asked.status_code == 202
    assert _nodes(live_registry)["gpu-1"]["sweep_requested_at"] is not None
    node.poll_plans()  # runs the plan now, delivers the run, says so
    with live_registry.client() as client:
        runs = client.get("/v1/runs", params={"node": "gpu-1"}).json()
    assert runs["count"] == 1
    assert (runs["data"][0]["model"], runs["data"][0]["status"]) == ("tiny", "ok")
    status = _nodes(live_registry)["gpu-1"]
    assert status["sweep_requested_at"] is None
    [state] = status["plans"]
    assert (state["last_status"], state["version"]) == ("ok", 1)
    node.poll_plans()  # the request was run: not again
    assert live_registry.count("runs") == 1


def test_a_node_without_the_model_reports_why_it_skips(
    live_registry: LiveRegistry, tmp_path: Path, tiny_llama: Path
) -> None:
    admin = live_registry.scoped_token("admin")
    models = {
        "missing": {"path": str(tmp_path / "nowhere.gguf")},
        "mismatch": {"path": str(tiny_llama), "sha256": "0" * 64},
        "searched": {"search_dirs": [str(tiny_llama.parent)], "sha256": _sha256(tiny_llama)},
        "not-found": {"search_dirs": [str(tmp_path)], "sha256": "1" * 64},
    }
    for name, model in models.items():
        assert _save(live_registry, admin, name, model=model).status_code == 201
    node = _daemon(tmp_path, live_registry, "edge", [tiny_llama.parent, tmp_path])
    node.poll_plans()
    with live_registry.client() as anyone:  # without a token: skipped, but not why
        [edge] = [n for n in anyone.get("/v1/nodes").json()["data"] if n["name"] == "edge"]
    assert {p["skipped"] for p in edge["plans"] if p["skipped"]} == {SKIP_HIDDEN}
    skipped = {p["name"]: p["skipped"] for p in _nodes(live_registry)["edge"]["plans"]}
    assert (
        skipped["missing"]
        == f"model missing: {tmp_path / 'nowhere.gguf'} is not a file on this node"
    )
    assert skipped["mismatch"].startswith(f"sha256 mismatch: {tiny_llama} is {_sha256(tiny_llama)}")
    assert skipped["searched"] is None
    assert node.planned["searched"].sweep.model == tiny_llama  # type: ignore[union-attr]
    assert skipped["not-found"].startswith(f"model missing: no .gguf file in {tmp_path}")
    assert [j.id for j in node.scheduler.get_jobs() if j.id.startswith("sweep:plan:")] == [
        "sweep:plan:searched"
    ]


def test_a_model_larger_than_the_node_is_skipped_for_memory(tiny_llama: Path) -> None:
    plan = PlanVersion.model_validate(
        {
            "name": "big",
            "version": 3,
            "created_at": "2026-12-01T00:00:00Z",
            "model": {"path": str(tiny_llama)},
            "cron": "0 3 * * *",
        }
    )
    planned = resolve_plan(
        plan,
        sha256_cache=tiny_llama.with_suffix(".json"),
        allowed_model_dirs=[tiny_llama.parent],
        memory_bytes=1024,
    )
    assert planned.sweep is None
    assert (planned.skipped or "").startswith("not enough memory: the model file is")


def test_a_node_started_while_the_registry_is_down_runs_its_cached_plans(
    database_url: str, tmp_path: Path, tiny_llama: Path
) -> None:
    with running_registry(RegistrySettings(database_url=database_url)) as registry:
        admin = registry.scoped_token("admin")
        assert _save(registry, admin, "nightly", model={"path": str(tiny_llama)}).status_code == 201
        first = _daemon(tmp_path, registry, "rack-7", [tiny_llama.parent])
        first.poll_plans()
        token = first.settings.current_token()
    # the registry is gone; the node restarts
    restarted = a_daemon(
        tmp_path / "rack-7",
        node="rack-7",
        registry_url=f"http://127.0.0.1:{free_port()}",
        token=token,
        plan_model_dirs=[tiny_llama.parent],
    )
    restarted.schedule()
    assert restarted.scheduler.get_job("sweep:plan:nightly") is not None  # before any poll
    restarted.poll_plans()  # unreachable: nothing changes
    assert list(restarted.planned) == ["nightly"]
    assert restarted.scheduler.get_job("sweep:plan:nightly") is not None


def test_bad_plans_are_refused_with_the_field_named(live_registry: LiveRegistry) -> None:
    admin = live_registry.scoped_token("admin")
    refused = {
        "no model place": {"model": {"sha256": "a" * 64}},
        "bad cron": {"model": {"path": "/m.gguf"}, "cron": "every night"},
        "bad setting": {"model": {"path": "/m.gguf"}, "settings": {"npl": [0]}},
        "unknown setting": {"model": {"path": "/m.gguf"}, "settings": {"gpu": "yes"}},
        "a canary build beside a binary": {
            "model": {"path": "/m.gguf"},
            "binary": "/opt/llama/llama-batched-bench",
            "binding_version": "0.3.99",
        },
        # 2 x 20 x 32 = 1,280 points a run: more than this registry takes in one
        "too large a grid": {
            "model": {"path": "/m.gguf"},
            "settings": {"npp": [128, 512], "ntg": list(range(1, 21)), "npl": list(range(1, 33))},
        },
    }
    for name, body in refused.items():
        answer = _save(live_registry, admin, name.replace(" ", "-"), **body)
        assert answer.status_code == 422, (name, answer.text)
        if name == "too large a grid":
            assert "has 1280 points" in answer.json()["detail"]
        if name == "a canary build beside a binary":
            assert "names its build by its binary" in answer.text
    with live_registry.client(live_registry.token("node-x")) as client:
        assert (
            client.put(
                "/v1/plans/x", json={"model": {"path": "/m"}, "cron": "0 3 * * *"}
            ).status_code
            == 403
        )
    with live_registry.client() as client:
        assert client.get("/v1/plans").json()["count"] == 0


def test_a_plan_saved_once_is_run_by_every_matching_agent_process(
    live_registry: LiveRegistry, tmp_path: Path, tiny_llama: Path
) -> None:
    """The daemons as a fleet runs them: `fleetbench-agent daemon` processes with no
    [[sweep]] of their own, polling every second."""
    admin = live_registry.scoped_token("admin")
    plan = {"labels": {"role": "gpu"}, "model": {"path": str(tiny_llama)}, "settings": TINY_GRID}
    assert _save(live_registry, admin, "fleet-wide", **plan).status_code == 201
    names = ["gpu-0", "gpu-1"]
    daemons = []
    for name in names:
        home = tmp_path / name
        home.mkdir()
        (home / "agent.toml").write_text(
            f"[agent]\njitter_s = 0\nplan_poll_s = 1\nplan_model_dirs = ['{tiny_llama.parent}']\n"
        )
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_")}
        env = {
            **inherited,
            "FLEETBENCH_NODE": name,
            "FLEETBENCH_REGISTRY_URL": live_registry.url,
            "FLEETBENCH_TOKEN": live_registry.token(name, role="gpu"),
            "FLEETBENCH_SPOOL": str(home / "spool.db"),
            "FLEETBENCH_CACHE_DIR": str(home / "cache"),
            "FLEETBENCH_BUSY_CPU_PERCENT": "100",  # the suite keeps this machine busy
        }
        with (home / "daemon.log").open("w") as log:  # the child holds its own copy
            daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fleetbench.agent.cli",
                    "daemon",
                    "--config",
                    str(home / "agent.toml"),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        daemons.append(daemon)
    try:
        _wait(lambda: all(_nodes(live_registry).get(n, {}).get("plans") for n in names))
        with live_registry.client(admin) as client:
            for name in names:
                assert client.post(f"/v1/plans/sweep-now/{name}").status_code == 202

        def every_node_ran_and_said_so() -> bool:
            # the run first, then the daemon's status saying how its plan's sweep went
            with live_registry.client() as client:
                runs = client.get("/v1/runs").json()["data"]
            nodes = _nodes(live_registry)
            said = all(nodes[n]["plans"] and nodes[n]["plans"][0]["last_status"] for n in names)
            return {r["node"] for r in runs} == set(names) and said

        logs = [tmp_path / n / "daemon.log" for n in names]
        _wait(every_node_ran_and_said_so, seconds=120, logs=logs)
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.wait(timeout=30)
    for name in names:
        [state] = _nodes(live_registry)[name]["plans"]
        assert (state["name"], state["version"], state["last_status"]) == ("fleet-wide", 1, "ok")


def _wait(done: Any, *, seconds: float = 60, logs: list[Path] | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            said = "\n".join(log.read_text()[-2000:] for log in logs or [])
            pytest.fail(f"not done in {seconds} s\n{said}")
        time.sleep(0.5)


def _plan_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": database_url, "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "fleetbench.registry.cli", "plan", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_registry_cli_applies_lists_and_retires_plans(
    live_registry: LiveRegistry, database_url: str, tmp_path: Path
) -> None:
    plan = tmp_path / "nightly.toml"
    plan.write_text(
        'labels = { pool = "h100" }\ncron = "0 3 * * *"\n'
        'model = { path = "/models/llama.gguf" }\n'
        'settings = { npl = [1, 8], flash-attn = "on" }\n'
    )
    first = _plan_cli(database_url, "apply", "nightly", str(plan))
    assert (first.returncode, first.stdout) == (0, "plan 'nightly' saved as version 1\n")
    again = _plan_cli(database_url, "apply", "nightly", str(plan))
    assert again.stdout == "plan 'nightly' unchanged at version 1\n"
    [listed] = json.loads(_plan_cli(database_url, "list", "--json").stdout)
    assert (listed["version"], listed["settings"]["npl"], listed["settings"]["flash_attn"]) == (
        1, [1, 8], "on",
    )  # fmt: skip
    assert listed["settings"]["repeats"] == "auto"  # a schedule's default
    bad = tmp_path / "bad.toml"
    bad.write_text('cron = "nightly"\nmodel = { sha256 = "abc" }\nsettings = { npl = [0] }\n')
    refused = _plan_cli(database_url, "apply", "nightly", str(bad))
    assert refused.returncode == 2
    for problem in ("cron:", "model.sha256:", "settings.npl.0:"):
        assert problem in refused.stderr, refused.stderr
    retired = _plan_cli(database_url, "retire", "nightly")
    assert retired.stdout == "plan 'nightly' retired at version 2\n"
    versions = json.loads(_plan_cli(database_url, "list", "nightly", "--json").stdout)
    assert [(v["version"], v["enabled"]) for v in versions] == [(2, False), (1, True)]
    unknown = _plan_cli(database_url, "sweep-now", "no-such-node")
    assert unknown.returncode == 1 and "node 'no-such-node' not found" in unknown.stderr
    live_registry.token("gpu-3")
    asked = _plan_cli(database_url, "sweep-now", "gpu-3")
    assert asked.returncode == 0, asked.stderr
    assert _nodes(live_registry)["gpu-3"]["sweep_requested_at"] is not None


def test_a_plan_runs_only_the_binaries_the_node_allows(tiny_llama: Path, tmp_path: Path) -> None:
    def plan(**fields: object) -> PlanVersion:
        return PlanVersion.model_validate(
            {
                "name": "binary",
                "version": 1,
                "created_at": "2026-12-01T00:00:00Z",
                "model": {"path": str(tiny_llama)},
                "cron": "0 3 * * *",
                **fields,
            }
        )

    cache = tmp_path / "sha256.json"
    named = plan(binary="/opt/llama/llama-batched-bench")
    refused = resolve_plan(named, sha256_cache=cache)
    assert refused.sweep is None
    assert refused.skipped == (
        "binary /opt/llama/llama-batched-bench is not one this node allows plans to run "
        "(agent.plan_binaries)"
    )
    on_path = resolve_plan(plan(engine="llama-batched-bench"), sha256_cache=cache)
    assert (on_path.skipped or "").startswith("binary llama-batched-bench (on PATH) is not one")
    allowed = [Path("/opt/llama/llama-batched-bench")]
    taken = resolve_plan(
        named, sha256_cache=cache, allowed_binaries=allowed, allowed_model_dirs=[tiny_llama.parent]
    )
    assert taken.skipped is None
    assert taken.sweep is not None and taken.sweep.binary == allowed[0]


def test_an_unreadable_model_is_a_skip_not_a_crash(
    tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root reads every file here, so the refusal another user would get is stood in for.
    def refuse(path: Path, **_: object) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("fleetbench.agent.plans.sha256_of", refuse)
    plan = PlanVersion.model_validate(
        {
            "name": "locked",
            "version": 1,
            "created_at": "2026-12-01T00:00:00Z",
            "model": {"path": str(tiny_llama), "sha256": "0" * 64},
            "cron": "0 3 * * *",
        }
    )
    planned = resolve_plan(
        plan, sha256_cache=tmp_path / "sha256.json", allowed_model_dirs=[tiny_llama.parent]
    )
    assert planned.sweep is None
    assert planned.skipped == f"model unreadable: [Errno 13] Permission denied: '{tiny_llama}'"


def test_a_canary_plan_runs_only_where_its_binding_version_is_installed(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """A plan naming a llama-cpp-python version sweeps the canaries that have it; every
    other node it picks skips it, saying which version it has."""
    installed = binding_version()

    def canary(version: str) -> PlanVersion:
        return PlanVersion.model_validate(
            {
                "name": "canary",
                "version": 1,
                "created_at": "2026-12-01T00:00:00Z",
                "labels": {"canary": "true"},
                "model": {"path": str(tiny_llama)},
                "cron": "0 3 * * *",
                "binding_version": version,
            }
        )

    cache = tmp_path / "sha256.json"
    elsewhere = resolve_plan(canary("0.0.1"), sha256_cache=cache)
    assert elsewhere.sweep is None
    assert elsewhere.skipped == (
        f"a canary plan for llama-cpp-python 0.0.1: this node has {installed}"
    )
    here = resolve_plan(
        canary(installed), sha256_cache=cache, allowed_model_dirs=[tiny_llama.parent]
    )
    assert here.skipped is None and here.sweep is not None
    # a plan without one keeps the body it had before the field existed
    plain = canary(installed).model_copy(update={"binding_version": None})
    assert "binding_version" not in plain.model_dump()
