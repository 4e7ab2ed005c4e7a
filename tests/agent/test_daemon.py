"""The daemon's parts: configuration, the lock, the busy guard, change detection, and
sweeps on Gemma 3 270M delivered to a live registry."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from fleetbench.agent.daemon import (
    ConfigError,
    Daemon,
    SweepConfig,
    busy_reason,
    load_config,
)
from fleetbench.agent.sweep import sweep_lock
from tests.factories import LiveRegistry, a_daemon

GOOD = """
[agent]
node = "gpu-07"
jitter_s = 120
busy_cpu_percent = 70

[[sweep]]
name = "gemma-nightly"
model = "/models/gemma.gguf"
cron = "0 3 * * *"
npl = [1, 2, 4, 8, 16]
flash_attn = "on"
ctx-size = 4096
threads = 4
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_config_reads_agent_and_sweeps(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD))
    settings = config.settings
    assert (settings.node, settings.jitter_s, settings.busy_cpu_percent) == ("gpu-07", 120, 70)
    [sweep] = config.sweeps
    spec = sweep.spec()
    assert (spec.npl, spec.flash_attn, spec.repeats, spec.npp) == (
        (1, 2, 4, 8, 16),
        "on",
        "auto",  # a schedule has time for the precision
        (128,),
    )
    assert (spec.n_ctx, spec.n_threads) == (4096, 4)  # by llama.cpp's flag names


def test_the_example_config_loads_and_a_config_needs_no_agent_table(tmp_path: Path) -> None:
    example = load_config(Path(__file__).parents[2] / "deploy" / "agent.toml.example")
    assert [s.name for s in example.sweeps] == [
        "nemo-nightly",
        "gemma-weekly-long-prompts",
        "nemo-with-the-node-s-own-build",
        "nemo-server",
        "nemo-server-slo",
    ]
    binary = example.sweeps[2]
    assert (binary.engine, binary.spec().n_ctx) == ("llama-batched-bench", 20480)
    assert example.settings.registry_url == "http://registry.internal:8787"
    assert example.settings.plan_serve_urls == ["http://127.0.0.1:8080"]
    searched = example.sweeps[4]
    assert searched.spec().slo == "ttft_p90<=2000ms,tps_per_user_p10>=10"  # type: ignore[attr-defined]
    sweeps_alone = load_config(_write(tmp_path, GOOD[GOOD.index("[[sweep]]") :]))
    assert sweeps_alone.settings.jitter_s == 300


def test_variables_win_over_the_file_and_the_file_over_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETBENCH_NODE", "gpu-08")
    monkeypatch.setenv("FLEETBENCH_BUSY_RETRY_S", "60")
    settings = load_config(_write(tmp_path, GOOD)).settings
    assert (settings.node, settings.busy_retry_s) == ("gpu-08", 60)  # the variables
    assert (settings.jitter_s, settings.busy_cpu_percent) == (120, 70)  # the file
    assert settings.flush_every_s == 60  # the default
    monkeypatch.setenv("FLEETBENCH_JITTER_S", "soon")
    with pytest.raises(ConfigError, match="FLEETBENCH_JITTER_S: Input should be a valid number"):
        load_config(_write(tmp_path, GOOD))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('cron = "0 3 * * *"', 'cron = "0 25 * * *"'), "sweep[0].cron"),
        (("npl = [1, 2, 4, 8, 16]", "npl = [0, 2]"), "sweep[0].npl[0]"),
        (('flash_attn = "on"', 'flash_attn = "maybe"'), "sweep[0].flash_attn"),
        (("jitter_s = 120", "jiter_s = 120"), "agent.jiter_s: Extra inputs are not permitted"),
        (('name = "gemma-nightly"', 'nam = "x"'), "sweep[0].name: Field required"),
        (("[agent]", "[agnet]"), "unknown table(s) ['agnet']"),
        (("[agent]", 'agent = "gpu-07"\n[x]'), "[agent] is one table, [[sweep]] and"),
        (("threads = 4", 'engine = "vllm"'), "sweep[0]: Value error, unknown engine 'vllm'"),
        (
            ("threads = 4", 'engine = "llama-cpp-python"\nbinary = "/b"'),
            "sweep[0]: Value error, engine 'llama-cpp-python' runs no binary",
        ),
        (("[agent]", "[agent"), "is not valid TOML"),
    ],
)
def test_a_bad_config_names_the_key(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(_write(tmp_path, GOOD.replace(*change)))


def test_daemon_command_rejects_a_bad_config_at_start(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace('cron = "0 3 * * *"', 'cron = "every night"'))
    result = subprocess.run(
        [sys.executable, "-m", "fleetbench.agent.cli", "daemon", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "sweep[0].cron" in result.stderr


def test_the_sweep_lock_holds_across_processes(tmp_path: Path) -> None:
    lock = tmp_path / "sweep.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from fleetbench.agent.sweep import sweep_lock\n"
            "with sweep_lock(Path(sys.argv[1])) as got:\n"
            "    print(got, flush=True); time.sleep(30)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        with sweep_lock(lock) as acquired:
            assert acquired is False
    finally:
        holder.kill()
        holder.communicate()
    with sweep_lock(lock) as acquired:
        assert acquired is True


def _daemon(
    tmp_path: Path,
    model: Path,
    registry_url: str = "http://127.0.0.1:9",
    token: str | None = None,
    load: tuple[float, float | None] = (5.0, None),
) -> Daemon:
    sweep = SweepConfig(
        name="gemma", model=model, cron="0 3 * * *", npp=[32], ntg=[4], npl=[1, 2], repeats=1
    )
    return a_daemon(tmp_path, sweep, load=load, registry_url=registry_url, token=token)


def test_a_busy_machine_postpones_the_sweep(tmp_path: Path, gemma: Path) -> None:
    daemon = _daemon(tmp_path, gemma, load=(93.0, None))
    assert daemon.run_sweep(daemon.config.sweeps[0], why="scheduled") == (
        "postponed: CPU 93% busy (limit 80%)"
    )
    busy_gpu = _daemon(tmp_path, gemma, load=(10.0, 55.0))
    assert "GPU 55% busy" in busy_gpu.run_sweep(busy_gpu.config.sweeps[0], why="scheduled")
    assert daemon.spool.runs() == []


def test_sweeps_are_delivered_and_changes_trigger_a_new_one(
    live_registry: LiveRegistry, tmp_path: Path, gemma: Path
) -> None:
    model = tmp_path / "gemma.gguf"
    shutil.copy(gemma, model)
    daemon = _daemon(tmp_path, model, live_registry.url, live_registry.token("ci-node"))
    [sweep] = daemon.config.sweeps
    assert daemon.changed_since_last_success(sweep) == "no successful run yet"
    assert daemon.run_sweep(sweep, why="first") == "ok"
    assert live_registry.count("runs") == 1
    assert daemon.changed_since_last_success(sweep) is None

    os.utime(model)  # touched, same bytes: nothing changed
    assert daemon.changed_since_last_success(sweep) is None
    with model.open("ab") as f:  # a different file under the same name
        f.write(b"\0")
    assert "model_sha256" in (daemon.changed_since_last_success(sweep) or "")


def test_a_killed_sweep_leaves_the_daemon_running_and_the_failure_reported(
    live_registry: LiveRegistry, tmp_path: Path, gemma: Path
) -> None:
    daemon = _daemon(tmp_path, gemma, live_registry.url, live_registry.token("ci-node"))
    [sweep] = daemon.config.sweeps
    stop = threading.Event()

    def kill_engines() -> None:
        while not stop.is_set():
            for child in psutil.Process().children():
                if "spawn_main" in " ".join(child.cmdline()):
                    child.kill()
            time.sleep(0.05)

    killer = threading.Thread(target=kill_engines, daemon=True)
    killer.start()
    try:
        status = daemon.run_sweep(sweep, why="scheduled")
    finally:
        stop.set()
        killer.join()
    assert status == "failed"
    with live_registry.client() as client:
        [run] = client.get("/v1/runs").json()["data"]
    assert run["status"] == "failed"
    assert "died of SIGKILL" in run["error"]
    assert daemon.run_sweep(sweep, why="again") == "ok"  # the daemon carries on
    assert live_registry.count("runs") == 2


def test_the_last_success_of_a_binary_sweep_is_remembered_as_it_was(tmp_path: Path) -> None:
    """A `binary =` sweep's engine is the binary's build, not llama-cpp-python's version:
    recorded and read back the same, so an unchanged build does not sweep again hourly.
    A sweep with no success yet reads as none, without writing."""
    from fleetbench.agent.sweep_state import SweepState

    state = SweepState(tmp_path / "sweeps.db")
    sqlite3.connect(tmp_path / "sweeps.db").close()  # an empty file: nothing recorded
    assert state.last("nightly-binary") is None
    binary = {"llama-batched-bench": "7100 0c1e570 CPU", "model_sha256": "ab" * 32}
    state.record("nightly-binary", binary)
    assert state.last("nightly-binary") == binary
    assert state.last("another") is None
    with sqlite3.connect(tmp_path / "sweeps.db") as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(sweep_successes)")]
    assert columns == ["sweep", "engine", "model_sha256", "at"]


@pytest.mark.parametrize(
    ("cpu", "gpu", "reason"),
    [
        (80.0, None, None),  # at the limit is not over it
        (80.1, None, "CPU 80% busy (limit 80%)"),
        (93.0, 55.0, "CPU 93% busy (limit 80%)"),  # the CPU is said first
        (10.0, 20.0, None),
        (10.0, 55.0, "GPU 55% busy (limit 20%)"),
        (10.0, None, None),  # no NVIDIA GPU: only the CPU counts
    ],
)
def test_the_busy_guard_decides_on_each_limit(
    cpu: float, gpu: float | None, reason: str | None
) -> None:
    assert busy_reason(cpu_percent=cpu, gpu_percent=gpu, cpu_limit=80, gpu_limit=20) == reason
