"""The memory llama.cpp allocated, as a sweep records it (agent/runners/llama_buffers.py):
from the log callback in-process and from llama-batched-bench's stderr, on a real llama.cpp;
and the KV-cache maths (contract/kv_cache.py) that placement's fit uses, checked against
what llama.cpp allocated for Gemma 3 270M (sliding-window layers) and the tiny llama."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.batched_bench_binary import BatchedBenchBinaryRunner
from fleetbench.agent.runners.llama_buffers import BufferLog, buffers_in
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.agent.sweep import measure_run, memory_line
from fleetbench.contract.allocation import (
    allocated_bytes,
    beside_kv_bytes,
    kv_prediction_error_pct,
    predicted_kv_bytes,
)
from fleetbench.contract.wire import AllocatedBuffer, RunReport

# llama-batched-bench's whole stderr on Gemma 3 270M: the vendored llama.cpp's build,
# `-c 2048 -npp 64 -ntg 4 -npl 1,2 -t 2 --output-format jsonl`, LLAMA_ARG_LOG_VERBOSITY=4.
CAPTURED = Path(__file__).parent.parent / "fixtures" / "llama-logs"


def test_the_buffer_lines_of_a_log_are_read() -> None:
    buffers = buffers_in((CAPTURED / "batched-bench-gemma3-270m.stderr").read_text().splitlines())
    assert buffers == [
        AllocatedBuffer(kind="model", device="CPU_Mapped", bytes=round(235.16 * 2**20)),
        AllocatedBuffer(kind="model", device="CPU_REPACK", bytes=round(12.66 * 2**20)),
        AllocatedBuffer(kind="output", device="CPU", bytes=2 * 2**20),
        AllocatedBuffer(kind="kv", device="CPU", bytes=6 * 2**20),
        AllocatedBuffer(kind="kv", device="CPU", bytes=30 * 2**20),
        AllocatedBuffer(kind="compute", device="CPU", bytes=round(514.5 * 2**20)),
    ]
    assert allocated_bytes(buffers, "kv") == 36 * 2**20
    assert beside_kv_bytes(buffers) == sum(b.bytes for b in buffers if b.kind != "kv")
    assert beside_kv_bytes(buffers[:1]) is None  # no compute buffer logged: not measured


def test_a_buffer_line_the_report_cannot_carry_is_left_out() -> None:
    lines = [
        "llama_kv_cache: " + "RPC[" + "x" * 80 + "] KV buffer size =     6.00 MiB",
        "llama_kv_cache:        CPU KV buffer size =    30.00 MiB",
    ]
    assert buffers_in(lines) == [AllocatedBuffer(kind="kv", device="CPU", bytes=30 * 2**20)]


def test_a_log_handed_over_in_pieces_is_joined_into_lines() -> None:
    log = BufferLog()
    for piece in ("llama_kv_cache:        CUDA0 KV buf", "fer size =   288.00 MiB\nllama_", "x\n"):
        log.write(piece)
    assert log.buffers() == [AllocatedBuffer(kind="kv", device="CUDA0", bytes=288 * 2**20)]


def _checked(report: RunReport) -> float:
    """The report's KV prediction error in %, after checking what it carries."""
    assert report.status == "ok"
    assert {b.kind for b in report.buffers} >= {"model", "kv", "compute"}
    error = kv_prediction_error_pct(
        predicted_kv_bytes(report), allocated_bytes(report.buffers, "kv")
    )
    assert error is not None
    return error


# (B values, context, unified): one sequence, several (each its own window), and one
# unified cache whose sliding window is shared by the sequences.
CONTEXTS = [((1,), 4096, False), ((1, 2, 4), 2048, False), ((1, 4), 4096, True)]


@pytest.mark.parametrize(("npl", "n_ctx", "unified"), CONTEXTS)
def test_the_kv_maths_agrees_with_what_llama_cpp_allocated_for_gemma(
    gemma: Path, tmp_path: Path, npl: tuple[int, ...], n_ctx: int, unified: bool
) -> None:
    spec = SweepSpec(npp=(64,), ntg=(4,), npl=npl, n_ctx=n_ctx, kv_unified=unified, n_threads=2)
    report = measure_run(
        gemma, spec, LlamaCppPythonRunner(), node="n", sha256_cache=tmp_path / "sha.json"
    )
    assert abs(_checked(report)) <= 5.0
    # Gemma's 262k-token vocabulary: logits scratch far beyond its 253 MB of weights
    compute = allocated_bytes(report.buffers, "compute")
    assert compute is not None and compute > 2 * (report.model.file_size or 0)
    line = memory_line(report)
    assert line is not None and line.startswith("memory llama.cpp allocated: weights")


def test_the_kv_maths_agrees_with_what_llama_cpp_allocated_for_the_tiny_llama(
    tiny_llama: Path, tmp_path: Path
) -> None:
    spec = SweepSpec(npp=(64,), ntg=(4,), npl=(1, 2), n_ctx=2048, n_threads=2)
    report = measure_run(
        tiny_llama, spec, LlamaCppPythonRunner(), node="n", sha256_cache=tmp_path / "sha.json"
    )
    # 2 layers x 2 KV heads x (16 + 16) f16 values: 256 bytes a cell, 0.5 MiB for 2,048
    assert allocated_bytes(report.buffers, "kv") == 2048 * 256
    assert abs(_checked(report)) <= 5.0


def test_the_binary_s_stderr_gives_its_buffers(
    batched_bench: Path, gemma: Path, tmp_path: Path
) -> None:
    spec = SweepSpec(npp=(64,), ntg=(4,), npl=(1, 2), n_ctx=2048, n_threads=2)
    report = measure_run(
        gemma,
        spec,
        BatchedBenchBinaryRunner(batched_bench),
        node="n",
        sha256_cache=tmp_path / "sha.json",
    )
    assert abs(_checked(report)) <= 5.0
    assert [b.kind for b in report.buffers if b.kind == "kv"] == ["kv", "kv"]  # SWA and global
