"""The external runner: the real llama-batched-bench, built from the llama.cpp that
llama-cpp-python vendors (scripts/build-llama-tool.sh), on Gemma 3 270M."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fleetbench.agent.daemon import SweepConfig
from fleetbench.agent.runners import SweepFailed, SweepSpec
from fleetbench.agent.runners.batched_bench_binary import (
    BatchedBenchBinaryRunner,
    binary_build,
    find_binary,
)
from fleetbench.agent.sweep import measure_run
from fleetbench.contract.wire import FailedPoint, Point
from tests.factories import LiveRegistry, a_daemon, agent

SMALL = SweepSpec(npp=(32,), ntg=(4,), npl=(1, 2))


def test_version_gives_the_build(batched_bench: Path) -> None:
    build = binary_build(batched_bench)
    assert build.binding == "llama-batched-bench"
    assert build.build_number is not None and build.commit


def test_sweep_with_the_binary(batched_bench: Path, gemma: Path) -> None:
    seen: list[Point | FailedPoint] = []
    outcome = BatchedBenchBinaryRunner(batched_bench).run(gemma, SMALL, on_point=seen.append)
    assert [(p.b, p.n_kv) for p in outcome.points] == [(1, 36), (2, 72)]
    assert seen == outcome.points
    assert all(
        p.s_tg and p.t_tg and p.s_tg == pytest.approx(p.b * 4 / p.t_tg, rel=1e-3)
        for p in outcome.points
    )
    # -c 72 asked; llama.cpp rounds the context up (to 512 here) and the record says so
    assert outcome.settings.n_ctx is not None and outcome.settings.n_ctx >= SMALL.context_size()
    assert outcome.settings.cache_type_k == "f16"
    assert outcome.engine.build_number is not None


def test_a_binary_run_carries_the_model_s_architecture(
    batched_bench: Path, gemma: Path, tmp_path: Path
) -> None:
    """Read from the GGUF header (the binary does not say), so placement can check the KV
    fit of a binary run as of an in-process one: Gemma 3 270M's numbers."""
    report = measure_run(
        gemma,
        SMALL,
        BatchedBenchBinaryRunner(batched_bench),
        node="n",
        sha256_cache=tmp_path / "sha256.json",
    )
    assert report.status == "ok"
    model = report.model
    assert (model.n_layer, model.n_head_kv, model.head_dim_k, model.head_dim_v) == (18, 1, 256, 256)
    assert (model.sliding_window, model.n_swa_layers, model.n_ctx_train) == (512, 15, 32768)
    assert (model.quantization, model.n_params) == ("Q4_K_M", 268098176)
    assert model.sha256 is not None and model.file_size == gemma.stat().st_size


def test_repeats_take_the_median(batched_bench: Path, gemma: Path) -> None:
    spec = SweepSpec(npp=(16,), ntg=(4,), npl=(2,), repeats=2)
    [point] = BatchedBenchBinaryRunner(batched_bench).run(gemma, spec).points
    assert point.repeats == 2 and point.s_tg_stdev is not None


def test_points_the_binary_skips_are_failures(batched_bench: Path, gemma: Path) -> None:
    spec = SweepSpec(npp=(200,), ntg=(56,), npl=(1, 2), n_ctx=256, kv_unified=True)
    outcome = BatchedBenchBinaryRunner(batched_bench).run(gemma, spec)
    assert [p.b for p in outcome.points] == [1]
    [failure] = outcome.failures
    assert (failure.b, failure.reason) == (
        2,
        "llama-batched-bench skipped it: more KV cells than the context has",
    )


def _filtered(batched_bench: Path, wrapper: Path, printing: str) -> Path:
    """The real binary behind `wrapper`, which passes its `--version` and stderr through and
    prints of its JSONL lines (`lines`) what the Python statements `printing` print."""
    wrapper.write_text(
        f"""#!{sys.executable}
import json, pathlib, subprocess, sys
done = subprocess.run([{str(batched_bench)!r}, *sys.argv[1:]], capture_output=True, text=True)
print(done.stderr, file=sys.stderr, end="")
if "--version" in sys.argv:
    print(done.stdout, end=""); sys.exit(0)
lines = [line for line in done.stdout.splitlines() if line.startswith("{{")]
{printing}
"""
    )
    wrapper.chmod(0o755)
    return wrapper


def test_a_point_whose_output_was_lost_is_not_called_skipped(
    batched_bench: Path, gemma: Path, tmp_path: Path
) -> None:
    """A very short run of the real binary (the tiny llama: milliseconds) at times exits
    before its log thread writes its last JSONL lines; seen here as the real binary's output
    without its last point, and an exit status of 0."""
    wrapper = _filtered(
        batched_bench, tmp_path / "loses-its-last-line", "print(*lines[:-1], sep='\\n')"
    )
    outcome = BatchedBenchBinaryRunner(wrapper).run(gemma, SMALL)
    assert [p.b for p in outcome.points] == [1]
    [lost] = outcome.failures
    assert (lost.b, lost.reason) == (
        2,
        "llama-batched-bench printed no result for it (72 KV cells of 512 fit)",
    )


def test_repeats_end_even_when_a_point_s_line_is_lost_every_time_after_the_first(
    batched_bench: Path, gemma: Path, tmp_path: Path
) -> None:
    """A point asked for N times is asked no more, measured or not: the sweep ends."""
    runs = tmp_path / "runs"
    printing = f"""runs = pathlib.Path({str(runs)!r})
count = int(runs.read_text()) if runs.exists() else 0
runs.write_text(str(count + 1))
print(*(line for line in lines if count == 0 or json.loads(line)["pl"] != 2), sep="\\n")"""
    wrapper = _filtered(batched_bench, tmp_path / "loses-b2-after-the-first-run", printing)
    spec = SweepSpec(npp=(32,), ntg=(4,), npl=(1, 2), repeats=3)
    outcome = BatchedBenchBinaryRunner(wrapper).run(gemma, spec)
    assert [(p.b, p.repeats) for p in outcome.points] == [(1, 3), (2, 1)]
    assert runs.read_text() == "3"


def test_a_binary_that_dies_part_way_keeps_its_points(
    batched_bench: Path, gemma: Path, tmp_path: Path
) -> None:
    # The real binary, killed as soon as it printed its first point.
    wrapper = tmp_path / "dies-after-one-point"
    wrapper.write_text(
        f"""#!{sys.executable}
import os, signal, subprocess, sys
child = subprocess.Popen([{str(batched_bench)!r}, *sys.argv[1:]], stdout=subprocess.PIPE, text=True)
for line in child.stdout:
    print(line, end="", flush=True)
    if line.startswith("{{"):
        child.kill()
        child.wait()
        os.kill(os.getpid(), signal.SIGKILL)
"""
    )
    wrapper.chmod(0o755)
    with pytest.raises(SweepFailed, match="exited with status -9") as caught:
        BatchedBenchBinaryRunner(wrapper).run(gemma, SweepSpec(npp=(32,), ntg=(4,), npl=(1, 2, 4)))
    assert [p.b for p in caught.value.points] == [1]


def test_a_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SweepFailed, match="not found"):
        find_binary(tmp_path / "llama-batched-bench")


def test_a_failed_binary_run_is_reported_as_the_binary_s(tmp_path: Path, tiny_llama: Path) -> None:
    report = measure_run(
        tiny_llama, SMALL, BatchedBenchBinaryRunner(tmp_path / "llama-batched-bench"), node="n"
    )
    assert report.status == "failed" and "not found" in (report.error or "")
    assert report.engine.binding == "llama-batched-bench"  # not llama-cpp-python


def test_an_old_binary_that_exits_1_after_its_version_still_gives_it(tmp_path: Path) -> None:
    # Older builds print `version:` first, then the compiler line, and exit 1.
    old = tmp_path / "llama-batched-bench"
    old.write_text(
        "#!/bin/sh\necho 'version: 4321 (abcdef0)'\n"
        "echo 'built with cc (GCC) 12.2.0 for x86_64-linux-gnu'\nexit 1\n"
    )
    old.chmod(0o755)
    build = binary_build(old)
    assert (build.build_number, build.commit) == (4321, "abcdef0")


def test_a_daemon_binary_sweep_records_its_success_under_the_binary_s_build(
    live_registry: LiveRegistry, batched_bench: Path, gemma: Path, tmp_path: Path
) -> None:
    """Through the daemon's own sweep path: the run is spooled and delivered, its success
    recorded under the binary's build (it once raised KeyError after spooling, so the
    sweep ran again at every hourly check), and nothing has changed since."""
    sweep = SweepConfig(
        name="nightly",
        model=gemma,
        cron="0 3 * * *",
        npp=[32],
        ntg=[4],
        npl=[1, 2],
        repeats=1,
        binary=batched_bench,
    )
    daemon = a_daemon(
        tmp_path, sweep, registry_url=live_registry.url, token=live_registry.token("ci-node")
    )
    [sweep] = daemon.config.sweeps
    assert daemon.changed_since_last_success(sweep) == "no successful run yet"
    assert daemon.run_sweep(sweep, why="first") == "ok"
    assert daemon.changed_since_last_success(sweep) is None
    build = binary_build(batched_bench)
    remembered = daemon._state.last("nightly")
    assert remembered is not None
    expected = f"{build.build_number} {build.commit} {build.backend}"
    assert remembered["llama-batched-bench"] == expected
    assert "llama-cpp-python" not in remembered
    [run] = daemon.spool.runs()
    assert run.state == "delivered"
    assert live_registry.count("runs") == 1


def test_sweep_command_with_the_binary_reports_its_build(
    live_registry: LiveRegistry, batched_bench: Path, gemma: Path, tmp_path: Path
) -> None:
    env = {
        "FLEETBENCH_REGISTRY_URL": live_registry.url,
        "FLEETBENCH_TOKEN": live_registry.token("ci-node"),
        "FLEETBENCH_NODE": "ci-node",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    result = agent(
        "sweep", "-m", str(gemma), "--binary", str(batched_bench), "--npp", "16", "--ntg", "4",
        "--npl", "1,2", "--report", "--json", **env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["engine"]["binding"] == "llama-batched-bench"
    assert report["engine"]["build_number"] == binary_build(batched_bench).build_number
    assert [p["b"] for p in report["points"]] == [1, 2]
    assert live_registry.count("runs") == 1
