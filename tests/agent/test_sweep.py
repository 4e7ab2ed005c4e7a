"""Sweeps on a real llama.cpp (llama-cpp-python): a tiny generated llama GGUF for the
mechanics, Gemma 3 270M Q4_K_M where a real model's numbers matter."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from fleetbench.agent.runners import SweepFailed, SweepSpec
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.agent.sweep import run_report
from fleetbench.contract.wire import (
    ERROR_LENGTH,
    REASON_LENGTH,
    FailedPoint,
    ModelInfo,
    Point,
    RunReport,
)

SMALL = SweepSpec(npp=(32,), ntg=(4,), npl=(1, 2, 4))


def test_sweep_measures_the_batched_bench_table(tiny_llama: Path) -> None:
    seen: list[Point | FailedPoint] = []
    outcome = LlamaCppPythonRunner().run(tiny_llama, SMALL, on_point=seen.append)
    assert [p.b for p in outcome.points] == [1, 2, 4]
    assert seen == outcome.points  # each point arrived as it was measured
    for p in outcome.points:
        assert p.n_kv == p.b * (32 + 4)
        assert p.t_pp and p.t_tg and p.s_pp and p.s_tg
        assert p.s_pp == pytest.approx(p.b * 32 / p.t_pp)
        assert p.s_tg == pytest.approx(p.b * 4 / p.t_tg)
        assert p.t == pytest.approx(p.t_pp + p.t_tg)
        assert p.s == pytest.approx(p.b * 36 / p.t)
    assert outcome.settings.n_ctx is not None and outcome.settings.n_ctx >= 4 * 36
    assert outcome.settings.n_threads == psutil.cpu_count(logical=False)
    assert (outcome.engine.binding, outcome.engine.backend) == ("llama-cpp-python", "CPU")


def test_shared_prompt_in_a_unified_cache(tiny_llama: Path) -> None:
    spec = SweepSpec(npp=(32,), ntg=(4,), npl=(1, 4), pp_shared=True, kv_unified=True)
    outcome = LlamaCppPythonRunner().run(tiny_llama, spec)
    four = outcome.points[1]
    assert four.n_kv == 32 + 4 * 4  # one prompt for all four sequences
    assert four.s_pp == pytest.approx(32 / four.t_pp)  # prefill counted once


def test_repeats_are_measured_and_combined_in_the_engine(tiny_llama: Path) -> None:
    """Three repeats reach the point with their spread; the median and spread maths on
    known samples is test_runners' test_a_point_from_its_repeats_is_the_median_time..."""
    outcome = LlamaCppPythonRunner().run(
        tiny_llama, SweepSpec(npp=(16,), ntg=(4,), npl=(2,), repeats=3)
    )
    [point] = outcome.points
    assert point.repeats == 3
    assert point.t_tg is not None and point.s_tg == pytest.approx(2 * 4 / point.t_tg)
    assert point.t_pp is not None and point.s_pp == pytest.approx(2 * 16 / point.t_pp)
    # speeds from the median times, and a spread over the three (noise sets its size)
    assert point.s_tg_stdev is not None and point.s_tg_stdev >= 0
    assert point.s_pp_stdev is not None and point.s_pp_stdev >= 0


def test_points_that_do_not_fit_are_failures_and_the_sweep_goes_on(tiny_llama: Path) -> None:
    # 1,024 cells split over 4 sequences leaves 256 each: a 300-token sequence cannot fit.
    spec = SweepSpec(npp=(296,), ntg=(4,), npl=(1, 4), n_ctx=1024)
    outcome = LlamaCppPythonRunner().run(tiny_llama, spec)
    reasons = {f.b: f.reason for f in outcome.failures}
    assert "memory slot" in reasons[1]
    assert reasons[4] == "needs 1200 KV cells, the context has 1024"
    assert outcome.points == []


def test_a_killed_engine_keeps_what_it_measured(gemma: Path) -> None:
    spec = SweepSpec(npp=(32,), ntg=(4,), npl=(1, 2, 4, 8))

    def kill_after_first(_: Point | FailedPoint) -> None:
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):  # one that ended meanwhile
                if "resource_tracker" not in " ".join(child.cmdline()):  # the engine (forked
                    child.kill()  # or spawned), not multiprocessing's resource tracker

    with pytest.raises(SweepFailed, match="died of SIGKILL") as caught:
        LlamaCppPythonRunner().run(gemma, spec, on_point=kill_after_first)
    assert [p.b for p in caught.value.points] == [1]

    report = run_report(
        node="n1",
        model=ModelInfo(name="gemma"),
        spec=spec,
        started_at=datetime.now(UTC),
        failure=caught.value,
    )
    assert report.status == "partial"
    assert [(f.b, f.reason) for f in report.failures] == [
        (2, "the engine's process died of SIGKILL"),
        (4, "the engine's process died of SIGKILL"),
        (8, "the engine's process died of SIGKILL"),
    ]
    # Labelled as a finished run of the same spec is: the same settings and engine, so
    # the registry sees no settings or binding change around it.
    finished = LlamaCppPythonRunner().run(gemma, spec)
    assert report.settings == finished.settings
    assert report.settings.n_ctx is not None and report.settings.n_ctx >= spec.context_size()
    assert report.settings.n_threads
    assert report.engine == finished.engine and report.engine.binding_version
    assert caught.value.started is not None
    assert caught.value.started.model == finished.model
    assert finished.model is not None and finished.model.n_layer == 18


def test_a_sweep_that_fails_before_its_engine_starts_reports_the_settings_asked_for() -> None:
    spec = SweepSpec(npp=(32,), ntg=(4,), npl=(1, 2), n_batch=256, cache_type_k="q8_0")
    report = _failed_to_load(spec)
    assert report.status == "failed"
    assert (report.settings.n_batch, report.settings.n_ubatch) == (256, 512)
    assert (report.settings.cache_type_k, report.settings.cache_type_v) == ("q8_0", "f16")
    assert (report.settings.flash_attn, report.settings.kv_unified) == ("auto", False)


def test_a_corrupt_model_fails_the_sweep_clearly(tmp_path: Path) -> None:
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(SweepFailed, match="could not load"):
        LlamaCppPythonRunner().run(corrupt, SMALL)


def test_the_engine_reports_the_models_architecture(gemma: Path) -> None:
    outcome = LlamaCppPythonRunner().run(gemma, SweepSpec(npp=(16,), ntg=(2,), npl=(1,)))
    assert outcome.model is not None
    m = outcome.model
    assert (m.n_layer, m.n_head_kv, m.head_dim_k, m.head_dim_v) == (18, 1, 256, 256)
    assert (m.sliding_window, m.n_swa_layers, m.n_ctx_train) == (512, 15, 32768)
    assert (m.quantization, m.n_params) == ("Q4_K_M", 268_098_176)


def test_points_whose_kv_cache_cannot_fit_are_skipped_with_the_reason(gemma: Path) -> None:
    # A unified cache sized per point: B=1 needs 260 cells (about 5 MB of KV), B=64 needs
    # 16,640 (about 290 MB); with the weights' 253 MB, 300 MB free admits only B=1.
    spec = SweepSpec(npp=(256,), ntg=(4,), npl=(1, 64), kv_unified=True)
    outcome = LlamaCppPythonRunner(free_bytes=300 * 2**20).run(gemma, spec)
    assert [p.b for p in outcome.points] == [1]
    [skipped] = outcome.failures
    assert skipped.b == 64
    assert skipped.reason.startswith("skipped: its KV cache for 16640 cells needs 0.29 GiB")
    assert outcome.settings.n_ctx is not None and outcome.settings.n_ctx < 16640


def test_a_failure_message_no_registry_could_store_still_makes_a_report() -> None:
    """An exception's text is not the agent's: a NUL (from a library's message) and a length
    past the wire's bound are made fit rather than losing the run."""
    failure = RuntimeError("llama_decode failed: \x00" + "x" * 30_000)
    report = run_report(
        node="n1",
        model=ModelInfo(name="gemma"),
        spec=SMALL,
        started_at=datetime.now(UTC),
        failure=failure,
    )
    assert report.status == "failed"
    assert report.error is not None and report.error.startswith("llama_decode failed: \ufffdx")
    assert len(report.error) == ERROR_LENGTH and report.error.endswith("\u2026")
    assert [len(f.reason) for f in report.failures] == [REASON_LENGTH] * 3


@pytest.mark.parametrize(
    ("setting", "value", "problem"),
    [
        ("threads", -1, "greater than or equal to 1"),
        ("n_gpu_layers", -2, "greater than or equal to -1"),
        ("cache_type_k", "q3_k", "Input should be 'f32'"),
        ("ubatch_size", 2**31, "less than or equal to 2147483647"),
        ("npl", [1, 0], "greater than or equal to 1"),
        ("n_ctx_max", 5, "Extra inputs are not permitted"),
    ],
)
def test_a_spec_refuses_what_the_wire_format_would_so_every_run_has_settings(
    setting: str, value: object, problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        SweepSpec.model_validate({setting: value})


def test_a_spec_reads_llama_cpp_s_flag_names_and_its_own_alike() -> None:
    by_flags = SweepSpec.model_validate(
        {
            "ctx-size": 4096,
            "batch_size": 512,
            "ubatch-size": 128,
            "threads": 2,
            "flash-attn": "on",
            "n-gpu-layers": 0,
            "cache-type-k": "q8_0",
            "kv-unified": True,
        }
    )
    by_names = SweepSpec(
        n_ctx=4096,
        n_batch=512,
        n_ubatch=128,
        n_threads=2,
        flash_attn="on",
        n_gpu_layers=0,
        cache_type_k="q8_0",
        kv_unified=True,
    )
    assert by_flags == by_names
    assert (by_names.n_ctx, by_names.n_batch, by_names.n_ubatch) == (4096, 512, 128)
    with pytest.raises(ValidationError, match="'ctx-size' and 'n_ctx' both set n_ctx"):
        SweepSpec.model_validate({"ctx-size": 4096, "n_ctx": 2048})


def _failed_to_load(spec: SweepSpec) -> RunReport:
    """The report of a sweep whose model llama.cpp could not load (before the engine said
    what it runs with)."""
    return run_report(
        node="n1",
        model=ModelInfo(name="gemma"),
        spec=spec,
        started_at=datetime.now(UTC),
        failure=SweepFailed("llama.cpp could not load gemma.gguf"),
    )
