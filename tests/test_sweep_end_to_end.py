"""`fleetbench-agent sweep --report` on Gemma 3 270M, delivered to a live registry."""

from __future__ import annotations

import json
from pathlib import Path

from tests.factories import LiveRegistry, agent


def _env(registry: LiveRegistry, token: str, tmp_path: Path) -> dict[str, str]:
    return {
        "FLEETBENCH_REGISTRY_URL": registry.url,
        "FLEETBENCH_TOKEN": token,
        "FLEETBENCH_NODE": "ci-node",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }


def test_sweep_reports_a_run_the_registry_places(
    live_registry: LiveRegistry, gemma: Path, tmp_path: Path
) -> None:
    env = _env(live_registry, live_registry.token("ci-node"), tmp_path)
    swept = agent(
        "sweep",
        "-m",
        str(gemma),
        "--npp",
        "32",
        "--ntg",
        "8",
        "--npl",
        "1,2,4",
        "--report",
        "--json",
        **env,
    )
    assert swept.returncode == 0, swept.stderr
    report = json.loads(swept.stdout)
    assert (report["status"], [p["b"] for p in report["points"]]) == ("ok", [1, 2, 4])
    assert report["model"]["sha256"] == (
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    )
    assert report["hardware"]["data"]["probes"]["host"]["cpu_threads"] >= 1
    assert "delivered to the registry" in swept.stderr
    assert live_registry.count("runs") == 1

    slowest = min(p["s_tg"] / p["b"] for p in report["points"])
    answer = agent(
        "placement",
        "--model",
        "gemma-3-270m-Q4_K_M.gguf",
        "--min-tps-per-user",
        str(slowest * 0.99),
        "--json",
        **env,
    )
    [candidate] = json.loads(answer.stdout)["candidates"]
    assert (candidate["node"], candidate["concurrency"]) == ("ci-node", 4)

    status = agent("status", **env)
    assert "0 queued, 1 delivered, 0 rejected" in status.stdout


def test_a_missing_model_is_a_failed_run_the_registry_still_gets(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    env = _env(live_registry, live_registry.token("ci-node"), tmp_path)
    result = agent("sweep", "-m", str(tmp_path / "gone.gguf"), "--report", "--json", **env)
    assert result.returncode == 1
    assert "model file not found" in result.stderr
    with live_registry.client() as client:
        [run] = client.get("/v1/runs").json()["data"]
    assert (run["status"], run["model"]) == ("failed", "gone")
    assert "model file not found" in run["error"]


def test_registry_down_during_a_sweep_queues_the_run(gemma: Path, tmp_path: Path) -> None:
    env = {
        "FLEETBENCH_REGISTRY_URL": "http://127.0.0.1:9",
        "FLEETBENCH_TOKEN": "fbn_x",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    result = agent(
        "sweep", "-m", str(gemma), "--npp", "16", "--ntg", "4", "--npl", "1", "--report", **env
    )
    assert result.returncode == 0, result.stderr
    assert "queued in the spool" in result.stderr
    assert "1 queued, 0 delivered" in agent("status", **env).stdout
