"""How much memory a context's KV cache takes, layer by layer, as the llama.cpp build that
creates it allocates it.

llama.cpp allocates the KV cache for the whole context when it creates it. Each cached layer
keeps K and V rows of its own width (its KV heads times its head sizes: Gemma 4's full and
sliding-window layers differ) for every cell of every stream (one per sequence, or one in all
when the cache is unified). A sliding-window layer keeps only its window and one micro-batch
(swa_full off, as the CLI and server run; the library's default is on), an MLA layer keeps
its latent in K alone (b7832+), next-token-prediction and shared-KV layers keep nothing, and
a sparse-attention indexer keeps a K-only cache of its own. The rules changed with builds:
each is selected by the node's build number, the build it starts from written beside it
(RULES; the sources are llama.cpp's src/llama-kv-cache*.cpp and src/llama-context.cpp).
What the maths cannot express is "fit unknown" with its reason, never a guess. Pure
arithmetic, checked against load logs llama.cpp printed for real models
(tests/contract/test_kv_cases.py) and against what the vendored llama.cpp allocates
(tests/agent/test_buffers.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from fleetbench.contract.wire import ModelInfo

__all__ = [
    "CACHE_TYPE_BYTES",
    "RULES",
    "CacheShape",
    "CacheType",
    "KvPrediction",
    "KvUnknown",
    "fits",
    "kv_bytes_read",
    "kv_cache_bytes",
    "kv_cells",
    "predict_kv",
    "rules_for",
]

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

# The builds each rule starts from (llama.cpp's build number: its commits on master).
SWA_CACHE = 5429  # #13194: sliding-window layers get a cache of their window
STREAMS = 6071  # #14363 (b5913) gave each sequence a stream; forced unified until #14959
V_PADDED = 5913  # without flash attention, V rows of differing widths padded to the widest
NO_PADDING = 6868  # #16812: no padding of the context or the window
PADDED_256 = 6975  # #17046: context and each sequence's share padded to 256 cells
V_LESS_MLA = 7832  # #19067: MLA layers keep no V
INDEXER = 9411  # #23346: a DSA indexer keeps its own K cache (DeepSeek V3.2)
GLM_INDEXER = 10119  # #25407: GLM-DSA's indexer cache
GLM_FULL_INDEXERS = 10243  # #26474: GLM-DSA keeps it on its "full" indexer layers only

RULES: tuple[tuple[int, str], ...] = (
    (0, "one cache for every layer at the full context"),
    (SWA_CACHE, "a sliding-window cache"),
    (V_PADDED, "V rows padded to the widest without flash attention"),
    (STREAMS, "a stream per sequence unless unified"),
    (NO_PADDING, "no padding"),
    (PADDED_256, "context padded to 256 cells per sequence"),
    (V_LESS_MLA, "MLA without V"),
    (INDEXER, "a sparse-attention indexer cache"),
    (GLM_INDEXER, "GLM-DSA's indexer cache"),
    (GLM_FULL_INDEXERS, "GLM-DSA's indexer on its full layers only"),
)
"""Where the rules changed, by the build each change starts from: a rule set is named by
the newest change at or before its build ("llama.cpp b6975+ rules")."""


@dataclass(frozen=True)
class CacheShape:
    """How a context's cache is made: its cells, sequences and settings, and the llama.cpp
    build that makes it (None: unknown, the newest rules are used and said to be)."""

    n_ctx: int
    n_seq: int = 1
    n_ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    unified: bool = False
    swa_full: bool = False
    flash_attn: str | None = None  # on, off, auto (None: auto, on where the device has it)
    build: int | None = None


@dataclass(frozen=True)
class KvPrediction:
    bytes: int
    rules: str  # which rules predicted it, for which build


@dataclass(frozen=True)
class KvUnknown:
    reason: str


def kv_cells(pp: int, tg: int, b: int, *, shared: bool, unified: bool) -> int:
    """KV cells a batched-bench point uses (its N_KV, `n_ctx_req` in batched-bench.cpp): B
    sequences of PP + TG, or with a shared prompt, the prompt once per cache (once in all
    when the cache is unified) plus B x TG."""
    if not shared:
        return b * (pp + tg)
    return (pp if unified else b * pp) + b * tg


@dataclass(frozen=True)
class _Layers:
    """Cached layers alike: how many, their K and V widths (elements per cell), whether
    they use the sliding window."""

    count: int
    k: int
    v: int
    swa: bool


def predict_kv(model: ModelInfo, shape: CacheShape) -> KvPrediction | KvUnknown:
    """The KV cache (and indexer cache) of `shape` for `model`, or why it cannot be said."""
    bytes_k = CACHE_TYPE_BYTES.get(shape.cache_type_k.lower())
    bytes_v = CACHE_TYPE_BYTES.get(shape.cache_type_v.lower())
    for cache_type, size in ((shape.cache_type_k, bytes_k), (shape.cache_type_v, bytes_v)):
        if size is None:
            return KvUnknown(f"its KV cache type {cache_type!r} is unknown")
    assert bytes_k is not None and bytes_v is not None
    build = shape.build if shape.build is not None else math.inf
    layers = _cached_layers(model, build, shape.flash_attn)
    if isinstance(layers, KvUnknown):
        return layers
    indexer = _indexer_layers(model, build)
    if isinstance(indexer, KvUnknown):
        return indexer
    streams, cells, swa_cells = _cells(model, shape, build)
    per_stream = (
        sum(
            group.count
            * (swa_cells if group.swa else cells)
            * (group.k * bytes_k + group.v * bytes_v)
            for group in layers
        )
        + cells * indexer * bytes_k
    )
    return KvPrediction(round(streams * per_stream), rules_for(shape.build))


def kv_cache_bytes(
    model: ModelInfo,
    *,
    n_ctx: int,
    n_seq: int = 1,
    n_ubatch: int = 512,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    unified: bool = False,
    swa_full: bool = False,
    flash_attn: str | None = None,
    build: int | None = None,
) -> int | None:
    """predict_kv's bytes, or None where it cannot say."""
    shape = CacheShape(
        n_ctx, n_seq, n_ubatch, cache_type_k, cache_type_v, unified, swa_full, flash_attn, build
    )
    found = predict_kv(model, shape)
    return found.bytes if isinstance(found, KvPrediction) else None


def kv_bytes_read(
    model: ModelInfo,
    depth: float,
    *,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    flash_attn: str | None = None,
) -> float | None:
    """The KV cache one sequence's decode step reads at `depth` cells: every cached layer's
    K and V rows of the cells it attends to (a sliding-window layer its window at most),
    and an indexer's K rows; None where it cannot be said. The newest rules: the rows as
    they are stored (V at the widest layer's width without flash attention), whatever
    number of cells the context was padded to."""
    bytes_k = CACHE_TYPE_BYTES.get(cache_type_k.lower())
    bytes_v = CACHE_TYPE_BYTES.get(cache_type_v.lower())
    layers = _cached_layers(model, math.inf, flash_attn)
    indexer = _indexer_layers(model, math.inf)
    if bytes_k is None or bytes_v is None or isinstance(layers, KvUnknown):
        return None
    if isinstance(indexer, KvUnknown):
        return None
    window = model.sliding_window or depth
    return (
        sum(
            group.count
            * min(depth, window if group.swa else depth)
            * (group.k * bytes_k + group.v * bytes_v)
            for group in layers
        )
        + depth * indexer * bytes_k
    )


def rules_for(build: int | None) -> str:
    """Which rules predict a cache made by `build` (None: unknown, the newest)."""
    since = max(start for start, _ in RULES if build is None or start <= build)
    rules = f"llama.cpp b{since}+ rules" if since else "llama.cpp rules before b5429"
    if build is None:
        return f"{rules} (the newest: the build is unknown)"
    return f"{rules}, for b{build}"


def _cached_layers(
    model: ModelInfo, build: float, flash_attn: str | None
) -> list[_Layers] | KvUnknown:
    """The layers that keep a KV cache, alike ones counted together (a model without
    per-layer facts is at most two groups, whatever n_layer says)."""
    if not (model.n_layer and model.head_dim_k and model.head_dim_v):
        return KvUnknown("the model's architecture numbers are unknown")
    full_k, full_v = model.head_dim_k, model.head_dim_v
    facts = model.layers
    if facts is None:
        if not model.n_head_kv:
            return KvUnknown("the model's architecture numbers are unknown")
        swa = min(model.n_swa_layers or 0, model.n_layer) if model.sliding_window else 0
        width_k, width_v = model.n_head_kv * full_k, model.n_head_kv * full_v
        return [
            _Layers(model.n_layer - swa, width_k, width_v, False),
            _Layers(swa, width_k, width_v, True),
        ]
    if len(facts.head_count_kv) != model.n_layer:
        return KvUnknown(
            f"the GGUF gives {len(facts.head_count_kv)} layers' KV heads for {model.n_layer} layers"
        )
    windows = facts.sliding_window_layers or [False] * model.n_layer
    widths = [
        (heads * (facts.head_dim_k_swa or full_k), heads * (facts.head_dim_v_swa or full_v), True)
        if swa
        else (heads * full_k, heads * full_v, False)
        for heads, swa in zip(facts.head_count_kv, windows, strict=True)
    ]
    # Next-token-prediction layers (the last ones) and shared-KV layers before them keep no
    # cache; a layer without KV heads is a recurrent one, whose state is not a KV cache.
    kept = model.n_layer - facts.nextn_layers - facts.shared_kv_layers
    cached = [(k, v, swa) for il, (k, v, swa) in enumerate(widths) if il < kept and k]
    if facts.mla and build >= V_LESS_MLA:
        cached = [(k, 0, swa) for k, _, swa in cached]
    elif flash_attn == "off" and build >= V_PADDED and len({v for _, v, _ in widths if v}) > 1:
        # V is stored transposed without flash attention, every layer at the widest V
        widest = max(v for _, v, _ in widths)
        cached = [(k, widest, swa) for k, _, swa in cached]
    return [_Layers(count, *layer) for layer, count in Counter(cached).items()]


def _indexer_layers(model: ModelInfo, build: float) -> int | KvUnknown:
    """The width of the indexer cache summed over the layers that keep one (elements per
    cell; 0: none)."""
    facts = model.layers
    if facts is None or not facts.indexer_head_dim or build < INDEXER:
        return 0
    trunk = model.n_layer - facts.nextn_layers if model.n_layer else 0
    if facts.architecture == "glm-dsa":
        if build < GLM_INDEXER:
            return 0
        if build >= GLM_FULL_INDEXERS:
            if facts.indexer_layers is None:
                return KvUnknown(
                    "GLM-DSA keeps an indexer cache on the layers attention.indexer.types "
                    "marks full, and this GGUF does not mark them"
                )
            return facts.indexer_head_dim * sum(facts.indexer_layers[:trunk])
    return facts.indexer_head_dim * trunk


def _cells(model: ModelInfo, shape: CacheShape, build: float) -> tuple[int, int, int]:
    """(streams, cells per stream of a full layer, cells per stream of a window layer)."""
    n_seq = max(shape.n_seq, 1)
    unified = shape.unified or build < STREAMS
    streams = 1 if unified else n_seq
    if build >= PADDED_256:
        n_ctx = _pad(shape.n_ctx, 256)
        cells = n_ctx if unified else _pad(n_ctx // n_seq, 256)
    elif build >= NO_PADDING:
        cells = shape.n_ctx if unified else -(-shape.n_ctx // n_seq)
    else:
        padding = 32 if shape.flash_attn == "off" else 256
        cells = _pad(shape.n_ctx if unified else -(-shape.n_ctx // n_seq), padding)
    window = model.sliding_window or 0
    if shape.swa_full or build < SWA_CACHE or not window:
        return streams, cells, cells
    wanted = window * (n_seq if unified else 1) + shape.n_ubatch
    if build >= PADDED_256:
        return streams, cells, _pad(min(cells, wanted), 256)
    padding = 1 if build >= NO_PADDING else (32 if shape.flash_attn == "off" else 256)
    return streams, cells, min(cells, _pad(wanted, padding))


def _pad(cells: int, to: int) -> int:
    return -(-cells // to) * to


def fits(
    model: ModelInfo | None,
    shape: CacheShape,
    *,
    free_bytes: int | None,
    beside_bytes: int | None = None,
) -> str | None:
    """Why a context of `shape` cannot fit in `free_bytes` beside the model's weights
    (`beside_bytes` when measured: the weights, compute and output buffers llama.cpp
    allocated; else the file's size), or None when it fits (or cannot be told)."""
    if model is None or free_bytes is None:
        return None
    found = predict_kv(model, shape)
    if isinstance(found, KvUnknown):
        return None
    beside = beside_bytes if beside_bytes is not None else model.file_size or 0
    if found.bytes + beside <= free_bytes:
        return None
    what = "weights and compute buffers as allocated" if beside_bytes is not None else "weights"
    return (
        f"its KV cache for {shape.n_ctx} cells needs {found.bytes / 2**30:.2f} GiB beside "
        f"{beside / 2**30:.2f} GiB of {what}; {free_bytes / 2**30:.2f} GiB is free"
    )
