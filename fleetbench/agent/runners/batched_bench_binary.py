"""The node's own `llama-batched-bench` binary, run with --output-format jsonl and read by the
import parser. Its build comes from `--version`. A run that dies part-way keeps the points it
printed; the points it never printed are failures with the reason. The output fingerprint is
taken after the points with the llama-server beside it (runners.binary_outputs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from fleetbench.agent import _proc
from fleetbench.agent.batched_bench_build import parse_build
from fleetbench.agent.batched_bench_output import (
    BatchedBenchOutputError,
    parse_batched_bench_output,
)
from fleetbench.agent.runners import (
    PointCallback,
    SweepFailed,
    SweepOutcome,
    SweepSpec,
    Window,
    point_from_samples,
)
from fleetbench.agent.runners.binary_outputs import binary_fingerprint
from fleetbench.agent.runners.llama_buffers import VERBOSE_ENV, buffers_in
from fleetbench.agent.runners.repeats import Key, Timing, still_to_measure
from fleetbench.agent.serving.outputs import NoFingerprint
from fleetbench.contract.kv_cache import kv_cells
from fleetbench.contract.wire import AllocatedBuffer, EngineBuild, FailedPoint, Point, RunSettings

__all__ = ["BINARY", "BatchedBenchBinaryRunner", "argv", "binary_build", "find_binary"]

BINARY = "llama-batched-bench"


def find_binary(configured: Path | None = None) -> Path:
    found = configured or (Path(p) if (p := shutil.which(BINARY)) else None)
    if found is None or not found.exists():
        raise SweepFailed(
            f"{configured or BINARY} not found: install llama.cpp's tools or give its path"
        )
    return found


def binary_build(binary: Path) -> EngineBuild:
    """Build number, commit and backend from `llama-batched-bench --version`."""
    try:
        text = _proc.run([str(binary), "--version"], timeout=30, with_stderr=True)
    except _proc.CommandFailed as exc:  # older builds print the version, then exit 1
        text = exc.output
    return parse_build(text).model_copy(update={"binding": BINARY})


def argv(binary: Path, model: Path, spec: SweepSpec) -> list[str]:
    """The command line that runs `spec` (the agent's and the benchmarks' one)."""
    argv = [
        str(binary), "-m", str(model),
        "-c", str(spec.context_size()), "-b", str(spec.n_batch), "-ub", str(spec.n_ubatch),
        "-npp", ",".join(map(str, spec.npp)), "-ntg", ",".join(map(str, spec.ntg)),
        "-npl", ",".join(map(str, spec.npl)),
        "-fa", spec.flash_attn, "-ngl", str(spec.n_gpu_layers),
        "-ctk", spec.cache_type_k, "-ctv", spec.cache_type_v,
        "--output-format", "jsonl",
    ]  # fmt: skip
    if spec.n_threads is not None:
        argv += ["-t", str(spec.n_threads)]
    if spec.pp_shared:
        argv.append("-pps")
    if spec.kv_unified:
        argv.append("-kvu")
    return argv


class BatchedBenchBinaryRunner:
    """Runs the sweep with the node's own llama-batched-bench: `binary`, or the one on PATH."""

    def __init__(self, binary: Path | None = None) -> None:
        self.binary = binary

    def identity(self) -> dict[str, str]:
        try:
            build = binary_build(find_binary(self.binary))
        except (SweepFailed, _proc.CommandNotFound, _proc.CommandFailed):
            return {BINARY: "missing"}
        return {BINARY: f"{build.build_number} {build.commit} {build.backend}"}

    def engine(self) -> EngineBuild:
        """The binary's build, as far as `--version` tells it."""
        try:
            return binary_build(find_binary(self.binary))
        except (SweepFailed, _proc.CommandNotFound, _proc.CommandFailed):
            return EngineBuild(binding=BINARY)

    def run(
        self, model_path: Path, spec: SweepSpec, *, on_point: PointCallback = lambda _: None
    ) -> SweepOutcome:
        return _run_sweep(find_binary(self.binary), model_path, spec, on_point)


def _run_sweep(binary: Path, model: Path, spec: SweepSpec, on_point: PointCallback) -> SweepOutcome:
    """Runs of the binary, each over the points still to measure (runners/repeats.py: N
    runs, or with auto until each point is precise); each point is the median of its
    repeats, told as soon as it is done."""
    engine = binary_build(binary)
    samples: dict[Key, list[Point]] = {}
    windows: dict[Key, list[Window]] = {}
    settings = RunSettings()
    buffers: list[AllocatedBuffer] | None = None  # the first run's: the whole grid's context
    # Runs asked for each point: one whose line a run lost is not asked for for ever
    cap = spec.max_repeats if spec.repeats == "auto" else spec.repeats
    asked: Counter[Key] = Counter()
    started = time.monotonic()
    todo = spec.grid()
    told: set[Key] = set()
    while todo:
        asked.update(todo)
        log: list[str] = []
        narrowed = _narrowed(spec, todo)
        for point, point_settings, ended in _one_run(
            binary, model, narrowed, samples, windows, log
        ):
            key = (point.pp, point.tg, point.b)
            if key in todo:  # a narrowed grid also holds points already done: left alone
                settings = point_settings
                samples.setdefault(key, []).append(point)
                if point.t:  # the binary prints each point as it ends, after T seconds
                    windows.setdefault(key, []).append((ended - point.t, ended))
        if buffers is None:
            buffers = buffers_in(log)
        timings = {key: _timings(measured) for key, measured in samples.items()}
        elapsed = time.monotonic() - started
        todo = [k for k in still_to_measure(spec, timings, elapsed_s=elapsed) if asked[k] < cap]
        for key in [k for k in samples if k not in todo and k not in told]:
            told.add(key)
            on_point(_combined(samples[key], spec))
    # The JSONL records carry most settings; these it does not print.
    known = {
        "kv_unified": spec.kv_unified,
        "cache_type_k": spec.cache_type_k,
        "cache_type_v": spec.cache_type_v,
    }
    outcome = SweepOutcome(
        engine, settings.model_copy(update=known), buffers=buffers or [], windows=windows
    )
    for pp, tg, pl in spec.grid():
        measured = samples.get((pp, tg, pl))
        if measured:
            outcome.points.append(_combined(measured, spec))
        else:
            failure = FailedPoint(
                pp=pp, tg=tg, b=pl, reason=_why_missing(pp, tg, pl, spec, settings)
            )
            outcome.failures.append(failure)
            on_point(failure)
    if spec.outputs and outcome.points:
        try:
            outcome.outputs = binary_fingerprint(binary, model, spec, engine)
        except NoFingerprint as exc:  # the run stands without it
            print(f"warning: no output fingerprint: {exc}", file=sys.stderr)
        except Exception as exc:  # (a server that cannot start: OSError, ...) so does it here
            print(f"warning: no output fingerprint: {type(exc).__name__}: {exc}", file=sys.stderr)
    return outcome


def _why_missing(pp: int, tg: int, pl: int, spec: SweepSpec, settings: RunSettings) -> str:
    """Why a run that ended well printed no result for a point: batched-bench skips a point
    that needs more KV cells than its context has; otherwise its output was lost (its log
    thread may not write the last lines of a very short run before it exits)."""
    cells = kv_cells(pp, tg, pl, shared=spec.pp_shared, unified=spec.kv_unified)  # its rule
    context = settings.n_ctx or spec.context_size()
    if cells > context:
        return "llama-batched-bench skipped it: more KV cells than the context has"
    return f"llama-batched-bench printed no result for it ({cells} KV cells of {context} fit)"


def _one_run(
    binary: Path,
    model: Path,
    spec: SweepSpec,
    measured: dict[Key, list[Point]],
    windows: dict[Key, list[Window]],
    log: list[str],
) -> Iterator[tuple[Point, RunSettings, float]]:
    """The points of one run of the binary as it prints them, each with the time.monotonic()
    its line came (its log flushes each line); `log` is given its stderr, kept in a file
    meanwhile (a pipe read only at the end would stop a binary whose log outgrows the
    pipe's buffer)."""
    with tempfile.TemporaryFile(mode="w+") as errors:
        process = subprocess.Popen(
            argv(binary, model, spec),
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, **VERBOSE_ENV},
        )
        assert process.stdout is not None
        try:
            for line in process.stdout:
                if not line.startswith("{"):
                    continue
                try:
                    [run] = parse_batched_bench_output(line)
                except BatchedBenchOutputError:
                    continue
                if run.points:  # a JSONL record is one point
                    yield run.points[0], run.settings, time.monotonic()
        finally:
            process.stdout.close()
            returncode = process.wait()
            errors.seek(0)
            log[:] = errors.read().splitlines()
    if returncode != 0:
        points = [_combined(p, spec) for p in measured.values()]
        lines = [line for line in log if line.strip()]
        raise SweepFailed(
            f"{BINARY} exited with status {returncode}: {lines[-1] if lines else 'no message'}",
            points,
            windows=windows,
        )


def _narrowed(spec: SweepSpec, todo: list[Key]) -> SweepSpec:
    """The spec of a run over the points of `todo` (the smallest grid holding them), in the
    context the whole grid had: points measured again in a smaller context would differ."""
    if todo == spec.grid():
        return spec
    return spec.model_copy(
        update={
            "npp": tuple(sorted({pp for pp, _, _ in todo})),
            "ntg": tuple(sorted({tg for _, tg, _ in todo})),
            "npl": tuple(sorted({b for _, _, b in todo})),
            "n_ctx": spec.context_size(),
        }
    )


def _combined(samples: list[Point], spec: SweepSpec) -> Point:
    if len(samples) == 1:
        return samples[0]
    first = samples[0]
    return point_from_samples(
        first.pp, first.tg, first.b, first.n_kv or 0, _timings(samples), shared=spec.pp_shared
    )


def _timings(samples: list[Point]) -> list[Timing]:
    """The (T_PP, T_TG) of each of a point's runs, as runners/repeats.py takes them."""
    return [(p.t_pp or 0.0, p.t_tg or 0.0) for p in samples]
