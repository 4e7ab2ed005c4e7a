"""A run that measured the CPU of a node with a GPU: marked on the run, in the node's health
and in placement, from fingerprints of the probes' output captured on real machines (an H100
through NVML, an MI250 through rocm-smi: tests/fixtures/probes/SOURCES.md), on SQLite and
PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fleetbench.agent import sweep as sweep_module
from fleetbench.agent.cli import app
from fleetbench.agent.probes.amd import parse_rocm_smi
from fleetbench.agent.probes.nvidia import NvidiaProbe
from fleetbench.contract import wire
from fleetbench.contract.accelerator import accelerator_of, off_accelerator
from tests.agent.test_probes_captured import PROBES, captured_h100
from tests.factories import ARTICLE_MODEL, DAY0, LiveRegistry, make_report, post_report

HOST = {"cpu_model": "AMD EPYC 9654", "memory_bytes": 2 * 2**40}


def h100_fingerprint_data() -> dict[str, Any]:
    return {"probes": {"nvidia": NvidiaProbe(captured_h100()).collect().data, "host": HOST}}


def _mi250_data() -> dict[str, Any]:
    return {"probes": {"amd": parse_rocm_smi((PROBES / "rocm-smi-a.json").read_text())}}


def test_which_runs_measured_the_nodes_gpu() -> None:
    h100 = h100_fingerprint_data()
    assert accelerator_of(h100) == "NVIDIA H100 80GB HBM3"
    assert off_accelerator(h100, "CPU", -1) == (
        "the engine ran on llama.cpp's CPU backend on a node with NVIDIA H100 80GB HBM3: "
        "install llama.cpp built for it (docs/install.md)"
    )
    assert off_accelerator(h100, "CUDA", -1) is None
    assert off_accelerator(h100, "CUDA", 0) == (
        "no layer was offloaded to NVIDIA H100 80GB HBM3 (n_gpu_layers 0)"
    )
    assert off_accelerator(h100, None, -1) is None  # what ran it is not known
    mi250 = _mi250_data()
    assert accelerator_of(mi250) is not None and "MI250" in str(accelerator_of(mi250))
    assert off_accelerator(mi250, "cpu", None) is not None
    apple = {"probes": {"apple": {"chip": "Apple M4 Pro", "memory_bytes": 24 * 2**30}}}
    assert off_accelerator(apple, "Metal", -1) is None
    assert off_accelerator(apple, "CPU", -1) is not None
    cpu_only = {"probes": {"host": HOST}}
    assert accelerator_of(cpu_only) is None and off_accelerator(cpu_only, "CPU", -1) is None
    assert accelerator_of({"probes": "not a section"}) is None


def _h100_report(node: str, backend: str, **fields: Any) -> wire.RunReport:
    return make_report(
        node=node,
        engine=wire.EngineBuild(build_number=7100, backend=backend),
        hardware=wire.HardwareFingerprint(hash="h100-" + "0" * 59, data=h100_fingerprint_data()),
        **fields,
    )


def _report_and_read(
    registry: LiveRegistry, token: str, report: wire.RunReport
) -> tuple[Any, Any, Any]:
    """Reports the run; then its detail, its node, and the placement answer for its model."""
    with registry.client(token) as client:
        assert post_report(client, report).status_code == 201
    with registry.client() as client:
        run = client.get(f"/v1/runs/{report.run_id}").json()
        node = client.get(f"/v1/nodes/{report.node}").json()
        answer = client.get(
            "/v1/placement", params={"model": ARTICLE_MODEL, "min_tps_per_user": 15}
        ).json()
    return run, node, answer


def test_a_cpu_curve_of_a_gpu_node_is_marked_and_placement_says_so(
    live_registry: LiveRegistry,
) -> None:
    token = live_registry.token("h100-1")
    on_cpu = _h100_report("h100-1", "CPU", started_at=DAY0)
    run, node, answer = _report_and_read(live_registry, token, on_cpu)
    assert run["engine_on_accelerator"] is False
    assert run["accelerator_note"].startswith("the engine ran on llama.cpp's CPU backend")
    assert node["health"] == "off accelerator"
    assert node["accelerator_note"] == run["accelerator_note"]
    [candidate] = answer["candidates"]
    assert candidate["engine_on_accelerator"] is False
    assert (
        "1 listed node(s) measured the engine on the CPU although they have a GPU (h100-1)"
        in (answer["reason"])
    )
    # the node reinstalled with llama.cpp built for CUDA: its next run is the GPU's
    on_gpu = _h100_report("h100-1", "CUDA", started_at=DAY0 + timedelta(hours=1))
    run, node, answer = _report_and_read(live_registry, token, on_gpu)
    assert (run["engine_on_accelerator"], run["accelerator_note"]) == (True, None)
    assert node["health"] != "off accelerator" and node["accelerator_note"] is None
    assert answer["candidates"][0]["engine_on_accelerator"] is True
    assert "measured the engine on the CPU" not in answer["reason"]


def test_the_sweep_command_warns_when_it_measured_the_cpu_of_a_gpu_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_llama: Path
) -> None:
    """This machine has no GPU: the fingerprint is the captured H100's (NVML's real output),
    the engine the CPU build llama-cpp-python has here."""
    h100 = wire.HardwareFingerprint(hash="h100-" + "0" * 59, data=h100_fingerprint_data())
    monkeypatch.setattr(sweep_module, "take_fingerprint", lambda: h100)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    done = CliRunner().invoke(
        app, ["sweep", "-m", str(tiny_llama), "--npp", "8", "--ntg", "4", "--npl", "1", "--json"]
    )
    assert done.exit_code == 0, done.output
    assert (
        "warning: the engine ran on llama.cpp's CPU backend on a node with NVIDIA H100 80GB "
        "HBM3: install llama.cpp built for it (docs/install.md)"
    ) in " ".join(done.output.split())
