"""bench/gpu_check.sh on a machine without a GPU: it refuses at once, saying why, and its
CPU path (--cpu-dry-run) runs every step end to end into its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"
# What nvidia-smi prints where the driver is installed but no GPU answers (captured on a
# node whose driver had not loaded).
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)


def run(*argv: str, path: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        [str(SCRIPT), *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_without_nvidia_smi_it_stops_at_once_and_says_so(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "dirname", "getconf", "realpath"):
        (bare / tool).symlink_to(f"/usr/bin/{tool}")
    done = run("--out", str(tmp_path / "out"), path=str(bare), timeout=30)
    assert done.returncode == 2
    assert "no NVIDIA GPU here: nvidia-smi is not installed" in done.stderr
    assert "--cpu-dry-run" in done.stderr
    assert not (tmp_path / "out").exists() and not (ROOT / ".venv-cuda").exists()


def test_with_a_driver_that_answers_no_gpu_it_stops_too(tmp_path: Path) -> None:
    stub = tmp_path / "bin" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/sh\ncat <<'EOF'\n{NO_DRIVER}\nEOF\nexit 9\n")
    stub.chmod(0o755)
    done = run(path=f"{stub.parent}:{os.environ['PATH']}", timeout=30)
    assert done.returncode == 2
    assert f"no NVIDIA GPU here: nvidia-smi found none ({NO_DRIVER})" in done.stderr


@pytest.mark.usefixtures("batched_bench")
def test_the_cpu_dry_run_runs_every_step_into_its_summary(tmp_path: Path) -> None:
    done = run("--cpu-dry-run", "--out", str(tmp_path), path=os.environ["PATH"], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["mode"], summary["passed"], summary["error"]) == ("cpu-dry-run", True, None)
    assert summary["model"] == "gemma-3-270m-Q4_K_M.gguf" and summary["gpus"] == []
    checks = {c["check"]: c["ok"] for c in summary["checks"]}
    assert checks == {
        "NVML sees a GPU": None,
        "in-process backend": True,
        "in-process buffers logged": True,
        "in-process device memory": None,
        "in-process energy": None,
        "binary backend": True,
        "binary buffers logged": True,
        "binary device memory": None,
        "binary energy": None,
        "both sweeps measured the same points": True,
        "placement lists the node on its accelerator": True,
    }
    for sweep in summary["sweeps"].values():
        assert [p["b"] for p in sweep["points"]] == [1, 2]
        assert all(p["s_tg"] > 0 for p in sweep["points"])
        # this VM lets the agent read no energy counter: none, and no error
        assert sweep["energy"] is None and all(
            p["tokens_per_joule"] is None for p in sweep["points"]
        )
    assert summary["sweeps"]["binary"]["binding"] == "llama-batched-bench"
    [candidate] = summary["placement"]["candidates"]
    assert candidate["node"] == "gpu-check" and candidate["engine_on_accelerator"] is None
    assert [row["b"] for row in summary["fidelity"]["per_b"]] == [1, 2]
    assert all(row["s_tg_ratio"]["median"] > 0 for row in summary["fidelity"]["per_b"])
    assert set(summary["seconds"]) == {
        "fingerprint",
        "in-process sweep",
        "binary sweep",
        "placement",
        "fidelity pairs",
    }


def test_a_step_that_fails_keeps_what_was_measured_before(tmp_path: Path) -> None:
    """No binary where it is said to be: the --binary sweep cannot run; the summary still
    holds the fingerprint's and the in-process sweep's figures, and the error."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--binary",
            str(tmp_path / "no-such-llama-batched-bench"),
            "--out",
            str(tmp_path),
            "--cpu-dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["passed"] is False
    assert summary["error"].startswith("StepFailed: fleetbench-agent sweep exited")
    assert [p["b"] for p in summary["sweeps"]["in-process"]["points"]] == [1, 2]
    assert "binary" not in summary["sweeps"]
    assert set(summary["seconds"]) == {"fingerprint", "in-process sweep"}
