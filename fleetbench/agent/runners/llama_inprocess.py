"""llama-batched-bench's algorithm in-process, on llama-cpp-python's low-level API (run in the
child process of runners/llama_cpp_python.py).

Follows tools/batched-bench/batched-bench.cpp of the llama.cpp that llama-cpp-python vendors:
an untimed warm-up of 16 random tokens; then per point a memory clear, the prompt of each
sequence (or one shared prompt) decoded in n_batch pieces with one synchronisation at the
end, and TG steps of one token per sequence, each synchronised before the next; the same
formulas for N_KV, T_PP, S_PP, T_TG, S_TG, T and S. Batches are built before the timer
starts; between steps only the tokens and positions change, copied with memmove.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from fleetbench.agent.gguf_model import ModelFileError, model_info, read_decode_weights
from fleetbench.agent.gguf_tensors import DecodeWeights
from fleetbench.agent.probes.nvidia import gpu_memory
from fleetbench.agent.runners import (
    PointCallback,
    StartCallback,
    SweepFailed,
    SweepOutcome,
    SweepSpec,
    WindowCallback,
    plan_grid,
    point_from_samples,
)
from fleetbench.agent.runners.llama_buffers import BufferLog
from fleetbench.agent.runners.llama_cpp_python import BINDING, binding_version
from fleetbench.agent.runners.llama_outputs import output_fingerprint
from fleetbench.agent.runners.repeats import Key, Timing, needs_more
from fleetbench.contract.kv_cache import kv_cells
from fleetbench.contract.wire import AllocatedBuffer, EngineBuild, FailedPoint, Point

__all__ = ["capture_llama_log", "run_sweep"]

_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
_WARMUP_TOKENS = 16
_DECODE_ERRORS = {
    1: "failed to find a memory slot for the batch (KV cache full)",
    2: "decode aborted",
    -1: "invalid input batch",
}


def run_sweep(
    model_path: Path,
    spec: SweepSpec,
    *,
    on_point: PointCallback = lambda _: None,
    on_start: StartCallback = lambda _: None,
    on_window: WindowCallback = lambda *_: None,
    free_bytes: int | None = None,
) -> SweepOutcome:
    """Loads the model, reads its architecture from llama.cpp, skips the points whose KV
    cache cannot fit in `free_bytes` (default: the memory free now) and measures the rest.
    `on_start` is told the engine, the settings the context took and the model first, and
    `on_window` each measurement's window."""
    llama = llama_bindings()
    rng = random.Random(0)  # the same tokens every sweep, as batched-bench's unseeded rand()
    llama.llama_backend_init()
    model_params = llama.llama_model_default_params()
    model_params.n_gpu_layers = spec.n_gpu_layers
    model = llama.llama_model_load_from_file(str(model_path).encode(), model_params)
    if not model:
        raise SweepFailed(f"llama.cpp could not load {model_path}")
    ctx = None
    try:
        info = model_info(
            _metadata(llama, model),
            name=model_path.name.removesuffix(".gguf"),
            sha256=None,
            file_size=model_path.stat().st_size,
            n_params=int(llama.llama_model_n_params(model)),
            weights=_decode_weights(model_path),
        )
        if free_bytes is None:
            free_bytes = _free_memory(llama, spec.n_gpu_layers)
        grid, skipped, n_ctx = plan_grid(spec, info, free_bytes)
        threads = spec.n_threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        ctx_params = llama.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = spec.n_batch
        ctx_params.n_ubatch = spec.n_ubatch
        ctx_params.n_seq_max = max(spec.npl)  # as batched-bench: enough for the largest B
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        ctx_params.flash_attn_type = _FLASH_ATTN[spec.flash_attn]
        ctx_params.kv_unified = spec.kv_unified
        ctx_params.swa_full = False  # the CLI's default; the library's is True
        ctx_params.type_k = _ggml_type(llama, spec.cache_type_k)
        ctx_params.type_v = _ggml_type(llama, spec.cache_type_v)
        ctx = llama.llama_init_from_model(model, ctx_params) if grid else None
        if grid and not ctx:
            raise SweepFailed(f"llama.cpp could not create a context of {n_ctx} cells")
        buffers = _captured_buffers()
        outcome = SweepOutcome(
            engine=EngineBuild(
                backend=_backend(llama),
                binding=BINDING,
                binding_version=binding_version(),
            ),
            settings=spec.run_settings(
                n_ctx=llama.llama_n_ctx(ctx) if ctx else n_ctx,
                # llama.cpp lowers n_batch to the context size: split by what it took, or
                # a larger batch aborts the process (GGML_ASSERT in llama_decode).
                n_batch=llama.llama_n_batch(ctx) if ctx else spec.n_batch,
                n_ubatch=llama.llama_n_ubatch(ctx) if ctx else spec.n_ubatch,
                n_threads=threads,
                n_threads_batch=threads,
            ),
            model=info,
            buffers=buffers,
        )
        on_start(
            SweepOutcome(outcome.engine, outcome.settings, model=outcome.model, buffers=buffers)
        )
        for failure in skipped:
            outcome.failures.append(failure)
            on_point(failure)
        if not grid:
            return outcome
        n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        assert outcome.settings.n_batch is not None and outcome.settings.n_ctx is not None
        bench = _Bench(llama, ctx, n_batch=outcome.settings.n_batch, n_vocab=n_vocab, rng=rng)
        bench.warm_up()
        results = _measure_grid(
            bench,
            grid,
            spec,
            n_kv_max=outcome.settings.n_ctx,
            on_point=on_point,
            on_window=on_window,
        )
        outcome.points.extend(r for r in results if isinstance(r, Point))
        outcome.failures.extend(r for r in results if isinstance(r, FailedPoint))
        if spec.outputs:  # after the timed points, in a context of its own
            llama.llama_free(ctx)
            ctx = None
            try:
                outcome.outputs = output_fingerprint(llama, model, n_threads=threads)
            except (RuntimeError, ValueError) as exc:  # the run stands without it
                print(f"warning: no output fingerprint: {exc}", file=sys.stderr)
        return outcome
    finally:
        if ctx:
            llama.llama_free(ctx)
        llama.llama_model_free(model)


def _measure_grid(
    bench: _Bench,
    grid: list[Key],
    spec: SweepSpec,
    *,
    n_kv_max: int,
    on_point: PointCallback,
    on_window: WindowCallback,
) -> list[Point | FailedPoint]:
    """Measures the grid round after round (runners/repeats.py) and tells each point as soon
    as it is done; returns them in the grid's order."""
    done: dict[Key, Point | FailedPoint] = {}
    measured: dict[Key, list[Timing]] = {}
    cells = {key: kv_cells(*key, shared=spec.pp_shared, unified=spec.kv_unified) for key in grid}
    for pp, tg, pl in grid:
        n_kv = cells[(pp, tg, pl)]
        if n_kv > n_kv_max:
            reason = f"needs {n_kv} KV cells, the context has {n_kv_max}"
            done[(pp, tg, pl)] = failure = FailedPoint(pp=pp, tg=tg, b=pl, reason=reason)
            on_point(failure)
        else:
            measured[(pp, tg, pl)] = []
    started = time.monotonic()
    while measured:
        for key in list(measured):  # one round; a point is told once it needs no more
            pp, tg, pl = key
            began = time.monotonic()
            timed = bench.measure(pp, tg, pl, shared=spec.pp_shared, unified=spec.kv_unified)
            if isinstance(timed, str):
                done[key] = FailedPoint(pp=pp, tg=tg, b=pl, reason=timed)
            else:
                on_window(key, (began, time.monotonic()))
                measured[key].append(timed)
                if needs_more(spec, key, measured[key], time.monotonic() - started):
                    continue
                done[key] = point_from_samples(
                    pp, tg, pl, cells[key], measured[key], shared=spec.pp_shared
                )
            del measured[key]
            on_point(done[key])
    return [done[key] for key in grid]


def llama_bindings() -> Any:
    """llama-cpp-python's ctypes bindings (`llama_cpp.llama_cpp`) without its package's
    `__init__`, which also loads the high-level API (numpy and jinja2 among others): 0.2 s
    of every sweep's start, in the engine's own process, for nothing this loop uses."""
    if "llama_cpp" not in sys.modules:
        found = importlib.util.find_spec("llama_cpp")
        if found is None or found.submodule_search_locations is None:
            raise SweepFailed("llama-cpp-python is not installed")
        package = importlib.util.module_from_spec(found)  # not executed: its __init__ is skipped
        sys.modules["llama_cpp"] = package
    return importlib.import_module("llama_cpp.llama_cpp")


def _metadata(llama: Any, model: Any) -> dict[str, Any]:
    """The model's GGUF metadata as llama.cpp read it (tokenizer arrays left out), with
    numbers and arrays turned back into values."""
    buffer = ctypes.create_string_buffer(1 << 16)
    metadata: dict[str, Any] = {}
    for i in range(llama.llama_model_meta_count(model)):
        llama.llama_model_meta_key_by_index(model, i, buffer, len(buffer))
        key = buffer.value.decode(errors="replace")
        if key.startswith("tokenizer."):
            continue
        llama.llama_model_meta_val_str_by_index(model, i, buffer, len(buffer))
        metadata[key] = _value(buffer.value.decode(errors="replace"))
    return metadata


def _decode_weights(model_path: Path) -> DecodeWeights | None:
    """The bytes a decode step reads, from the file's header: llama.cpp's API gives the
    metadata but no tensor's type. The header is read once, its vocabulary skipped (60 ms
    for Gemma 3's 262k tokens). A file llama.cpp loaded but that cannot be read again now
    (replaced, removed) costs the figures, not the sweep."""
    try:
        return read_decode_weights(model_path)
    except ModelFileError:
        return None


def _value(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _free_memory(llama: Any, n_gpu_layers: int) -> int | None:
    """Memory the model and its KV cache can use: the GPU's when layers go there (NVML),
    else the host's available memory."""
    if n_gpu_layers != 0 and llama.llama_supports_gpu_offload():
        memory = gpu_memory()  # None: no check rather than a wrong one
        return int(memory[0].free) if memory else None
    return int(psutil.virtual_memory().available)


def capture_llama_log(log: BufferLog) -> None:
    """llama.cpp logs every tensor it loads to stderr; a sweep shows its own progress, and
    keeps from the log only the buffers llama.cpp allocated."""
    llama = llama_bindings()

    def keep(_level: int, text: bytes, _user_data: Any) -> None:
        if _log is not None:  # none once the context is made: see _captured_buffers
            _log.write(text.decode(errors="replace"))

    global _callback, _log  # the callback must outlive this call: llama.cpp keeps the pointer
    _log = log
    _callback = llama.llama_log_callback(keep)
    llama.llama_log_set(_callback, None)


_callback: Any = None
_log: BufferLog | None = None


def _captured_buffers() -> list[AllocatedBuffer]:
    """The buffers logged so far (the model's and the context's), and the log no longer
    read: llama.cpp logs debug lines at every decode step, which the timed loop should not
    pay for in Python beyond the callback's first test."""
    global _log
    log, _log = _log, None
    return log.buffers() if log is not None else []


def _ggml_type(llama: Any, name: str) -> int:
    value = getattr(llama, f"GGML_TYPE_{name.upper()}", None)
    if value is None:
        raise ValueError(f"unknown cache type {name!r} (f16, q8_0, q4_0, ...)")
    return int(value)


def _backend(llama: Any) -> str:
    """The backend that runs the model: the first GPU device ggml registered (CUDA0 -> CUDA,
    Metal, Vulkan0 -> Vulkan, ROCm0 -> ROCm), else CPU. llama-cpp-python does not bind ggml's
    device registry, so it is read from the libggml it ships."""
    lib_dir = Path(llama.__file__).parent / "lib"
    found = [p for name in ("libggml.so", "libggml.dylib") if (p := lib_dir / name).exists()]
    if not found:
        return "GPU" if llama.llama_supports_gpu_offload() else "CPU"
    ggml = ctypes.CDLL(str(found[0]))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_name.restype = ctypes.c_char_p
    ggml.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(device) in (1, 2):  # GGML_BACKEND_DEVICE_TYPE_GPU, IGPU
            return ggml.ggml_backend_dev_name(device).decode().rstrip("0123456789") or "GPU"
    return "CPU"


class _Bench:
    def __init__(
        self, llama: Any, ctx: Any, *, n_batch: int, n_vocab: int, rng: random.Random
    ) -> None:
        self.llama = llama
        self.ctx = ctx
        self.memory = llama.llama_get_memory(ctx)
        self.n_batch = n_batch
        self.n_vocab = n_vocab
        self.rng = rng

    def _batch(self, tokens: list[tuple[int, int, int, bool]]) -> Any:
        """A llama_batch of (token, pos, seq, wants logits)."""
        batch = self.llama.llama_batch_init(len(tokens), 0, 1)
        for i, (token, pos, seq, logits) in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        batch.n_tokens = len(tokens)
        return batch

    def _pieces(self, batch: Any) -> list[Any]:
        """Views of `batch` of at most n_batch tokens each (decode_helper's sub-batches)."""
        llama = self.llama
        pieces = []
        for start in range(0, batch.n_tokens, self.n_batch):
            piece = llama.llama_batch()
            piece.n_tokens = min(self.n_batch, batch.n_tokens - start)
            piece.token = ctypes.cast(
                ctypes.addressof(batch.token.contents) + start * 4,
                type(batch.token),
            )
            piece.embd = batch.embd
            piece.pos = ctypes.cast(
                ctypes.addressof(batch.pos.contents) + start * 4, type(batch.pos)
            )
            piece.n_seq_id = ctypes.cast(
                ctypes.addressof(batch.n_seq_id.contents) + start * 4, type(batch.n_seq_id)
            )
            piece.seq_id = ctypes.cast(
                ctypes.addressof(batch.seq_id.contents) + start * ctypes.sizeof(ctypes.c_void_p),
                type(batch.seq_id),
            )
            piece.logits = ctypes.cast(
                ctypes.addressof(batch.logits.contents) + start, type(batch.logits)
            )
            pieces.append(piece)
        return pieces

    def _decode(self, pieces: list[Any], *, synchronize: bool) -> int:
        for piece in pieces:
            status = int(self.llama.llama_decode(self.ctx, piece))
            if status != 0:
                return status
            if synchronize:
                self.llama.llama_synchronize(self.ctx)
        return 0

    def _token(self) -> int:
        return self.rng.randrange(self.n_vocab)

    def warm_up(self) -> None:
        batch = self._batch([(self._token(), i, 0, False) for i in range(_WARMUP_TOKENS)])
        try:
            status = self._decode(self._pieces(batch), synchronize=True)
        finally:
            self.llama.llama_batch_free(batch)
        if status != 0:
            raise SweepFailed(f"warm-up decode failed: {_reason(status)}")
        self.llama.llama_memory_clear(self.memory, False)

    def measure(self, pp: int, tg: int, pl: int, *, shared: bool, unified: bool) -> Timing | str:
        """One measurement of a point: (T_PP, T_TG), or why it failed."""
        llama = self.llama
        prompts = 1 if shared else pl
        prompt = self._batch(
            [(self._token(), i, j, i == pp - 1) for j in range(prompts) for i in range(pp)]
        )
        step = self._batch([(0, pp, j, True) for j in range(pl)])
        # Every TG step's tokens and positions, laid out before the timer starts.
        tokens = (ctypes.c_int32 * (tg * pl))(*(self._token() for _ in range(tg * pl)))
        positions = (ctypes.c_int32 * (tg * pl))(*(pp + i for i in range(tg) for _ in range(pl)))
        prompt_pieces, step_pieces = self._pieces(prompt), self._pieces(step)
        row = pl * 4
        try:
            llama.llama_memory_clear(self.memory, False)
            t_pp_start = time.perf_counter()
            if pp > 0 and (status := self._decode(prompt_pieces, synchronize=False)) != 0:
                return _reason(status)
            llama.llama_synchronize(self.ctx)
            t_pp_end = time.perf_counter()

            if shared:
                for j in range(1, pl):
                    llama.llama_memory_seq_cp(self.memory, 0, j, -1, -1)
                if not unified:
                    # batched-bench decodes one dummy token to apply the copy
                    dummy = self._batch([(self._token(), pp, 0, True)])
                    try:
                        if (status := self._decode(self._pieces(dummy), synchronize=True)) != 0:
                            return _reason(status)
                    finally:
                        llama.llama_batch_free(dummy)
                    llama.llama_memory_seq_rm(self.memory, 0, pp, -1)

            t_tg_start = time.perf_counter()
            for i in range(tg):
                ctypes.memmove(step.token, ctypes.addressof(tokens) + i * row, row)
                ctypes.memmove(step.pos, ctypes.addressof(positions) + i * row, row)
                if (status := self._decode(step_pieces, synchronize=True)) != 0:
                    return _reason(status)
            t_tg_end = time.perf_counter()
        finally:
            llama.llama_batch_free(prompt)
            llama.llama_batch_free(step)
        return t_pp_end - t_pp_start, t_tg_end - t_tg_start


def _reason(status: int) -> str:
    return f"llama_decode returned {status}: {_DECODE_ERRORS.get(status, 'fatal error')}"
