"""How much memory a context's KV cache takes, from a model's architecture numbers.

llama.cpp allocates the KV cache for the whole context when it creates it: every layer that
attends globally keeps K and V for every cell; a sliding-window layer (with swa_full off, as
the CLI runs) keeps only its window plus one micro-batch, per sequence (per cache when the
cache is unified), in multiples of 256 cells (llama-kv-cache-iswa.cpp). Pure arithmetic,
checked against what llama.cpp allocates (tests/agent/test_buffers.py).
"""

from __future__ import annotations

from typing import Literal

from fleetbench.contract.wire import ModelInfo

__all__ = ["CACHE_TYPE_BYTES", "CacheType", "fits", "kv_cache_bytes", "kv_cells"]

# The KV cache types llama.cpp takes (-ctk, -ctv)
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]

# Bytes per element of each cache type (block-quantised types: block bytes / block size).
CACHE_TYPE_BYTES: dict[str, float] = {  # keyed by CacheType
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}


def kv_cells(pp: int, tg: int, b: int, *, shared: bool, unified: bool) -> int:
    """KV cells a batched-bench point uses (its N_KV, `n_ctx_req` in batched-bench.cpp): B
    sequences of PP + TG, or with a shared prompt, the prompt once per cache (once in all
    when the cache is unified) plus B x TG."""
    if not shared:
        return b * (pp + tg)
    return (pp if unified else b * pp) + b * tg


def kv_cache_bytes(
    model: ModelInfo,
    *,
    n_ctx: int,
    n_seq: int = 1,
    n_ubatch: int = 512,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    unified: bool = False,
) -> int | None:
    """KV bytes of a context of `n_ctx` cells for `n_seq` sequences; None when the model
    lacks the numbers (layers, KV heads, head sizes) to say, or a cache type is unknown."""
    if not (model.n_layer and model.n_head_kv and model.head_dim_k and model.head_dim_v):
        return None
    bytes_k = CACHE_TYPE_BYTES.get(cache_type_k.lower())
    bytes_v = CACHE_TYPE_BYTES.get(cache_type_v.lower())
    if bytes_k is None or bytes_v is None:
        return None  # a cache type this table does not know: no estimate, not an error
    per_cell_per_layer = model.n_head_kv * (model.head_dim_k * bytes_k + model.head_dim_v * bytes_v)
    swa_layers = (model.n_swa_layers or 0) if model.sliding_window else 0
    full_layers = model.n_layer - swa_layers
    swa_cells = n_ctx
    if swa_layers and model.sliding_window:
        window = model.sliding_window
        if unified:
            swa_cells = _window_cells(n_ctx, window * n_seq + n_ubatch)
        else:
            per_seq = n_ctx // max(n_seq, 1)
            swa_cells = max(n_seq, 1) * _window_cells(per_seq, window + n_ubatch)
    return round(per_cell_per_layer * (full_layers * n_ctx + swa_layers * swa_cells))


def _window_cells(cells: int, window: int) -> int:
    """A sliding-window cache's cells beside a full cache of `cells`: the window, rounded up
    to 256 cells as llama.cpp allocates, never more than the full cache."""
    return min(cells, -(-window // 256) * 256)


def fits(
    model: ModelInfo | None,
    *,
    n_ctx: int,
    n_seq: int,
    n_ubatch: int,
    cache_type_k: str,
    cache_type_v: str,
    free_bytes: int | None,
    beside_bytes: int | None = None,
    unified: bool = False,
) -> str | None:
    """Why a context of `n_ctx` cells cannot fit in `free_bytes` beside the model's weights
    (`beside_bytes` when measured: the weights, compute and output buffers llama.cpp
    allocated; else the file's size), or None when it fits (or the numbers are missing)."""
    if model is None or free_bytes is None:
        return None
    kv = kv_cache_bytes(
        model,
        n_ctx=n_ctx,
        n_seq=n_seq,
        n_ubatch=n_ubatch,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        unified=unified,
    )
    if kv is None:
        return None
    beside = beside_bytes if beside_bytes is not None else model.file_size or 0
    if kv + beside <= free_bytes:
        return None
    what = "weights and compute buffers as allocated" if beside_bytes is not None else "weights"
    return (
        f"its KV cache for {n_ctx} cells needs {kv / 2**30:.2f} GiB beside "
        f"{beside / 2**30:.2f} GiB of {what}; {free_bytes / 2**30:.2f} GiB is free"
    )
