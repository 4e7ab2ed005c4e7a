"""Describe a GGUF model file: its sha256, the architecture numbers KV-cache maths needs and
the bytes a decode step reads (gguf_tensors.py).

The metadata and tensor infos are read from the file's header alone, skipping the
tokenizer's arrays and the tensor data: the `gguf` package's reader builds every field, which
took 9 s for Gemma 3's 262k-token vocabulary (GGUF v2 and v3: docs/gguf.md of llama.cpp's
ggml).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from stat import S_ISREG
from typing import Any, BinaryIO

from pydantic import ValidationError

from fleetbench.agent.gguf_tensors import DecodeWeights, TensorInfo, decode_weights
from fleetbench.contract.wire import KvLayers, ModelInfo

__all__ = [
    "FILE_TYPES",
    "ModelFileError",
    "describe_gguf",
    "model_info",
    "read_decode_weights",
    "sha256_of",
]

# Where a GGUF has no `<arch>.attention.sliding_window_pattern`, llama.cpp assumes a pattern
# per architecture (every n-th layer attends globally); these are its defaults for the
# common sliding-window families (src/models/<arch>.cpp, load_swa_pattern).
_DEFAULT_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2}

_HASH_CHUNK = 1 << 20

# general.file_type: llama.cpp's llama_ftype (include/llama.h), named as the gguf package's
# LlamaFileType names it less its MOSTLY_ prefix. A table of our own because model_info runs
# in the engine's process before its timed loop, and importing gguf loads numpy there (and
# OpenBLAS's thread pool); tests check it against the package.
FILE_TYPES = {
    0: "ALL_F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    1024: "GUESSED",
}


class ModelFileError(ValueError):
    """The model file is missing, unreadable or not a GGUF file."""


def sha256_of(path: Path, *, cache: Path | None = None) -> str:
    """The file's SHA-256. With `cache` (a JSON file), a file whose path, size and mtime
    are unchanged is not read again: a 20 GB model is hashed once, not every night. Only a
    regular file is read, and no more of it than its size says: a FIFO, a device or a
    /proc file (endless, or blocking) raises OSError instead of holding the caller."""
    stat = path.stat()
    _regular(path, stat.st_mode)
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    known: dict[str, str] = {}
    if cache is not None:
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
        if key in known:
            return known[key]
    digest = hashlib.sha256()
    # Non-blocking: a FIFO swapped in since the stat above opens without waiting for a writer.
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        _regular(path, os.fstat(f.fileno()).st_mode)
        left = stat.st_size
        while left > 0 and (chunk := f.read(min(_HASH_CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
    if cache is not None:
        prefix = f"{path.resolve()}|"
        kept = {k: v for k, v in known.items() if not k.startswith(prefix)}  # stale entries
        temporary = cache.with_suffix(".tmp")
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps({**kept, key: digest.hexdigest()}))
            temporary.replace(cache)
        except OSError:  # a full disk: the digest is right, it is only not remembered
            temporary.unlink(missing_ok=True)
    return digest.hexdigest()


def _regular(path: Path, mode: int) -> None:
    if not S_ISREG(mode):
        raise OSError(f"{path} is not a regular file")


def describe_gguf(
    path: Path, *, name: str | None = None, sha256_cache: Path | None = None
) -> ModelInfo:
    """ModelInfo for a GGUF file, from its header alone (sweeps take the same numbers from
    llama.cpp, which loads the model anyway); `name` defaults to the file name without
    `.gguf`."""
    metadata, tensors = _read_file_header(path)
    return model_info(
        metadata,
        name=name or path.name.removesuffix(".gguf"),
        sha256=sha256_of(path, cache=sha256_cache),
        file_size=path.stat().st_size,
        n_params=sum(math.prod(tensor.dims) for tensor in tensors),
        weights=decode_weights(tensors, metadata),
    )


def read_decode_weights(path: Path) -> DecodeWeights | None:
    """The bytes a decode step reads, from the file's header: for a caller that has the
    metadata from elsewhere (the in-process runner, from llama.cpp) but no tensor infos."""
    metadata, tensors = _read_file_header(path)
    return decode_weights(tensors, metadata)


def _read_file_header(path: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    try:
        with path.open("rb") as f:
            return _read_header(f)
    except FileNotFoundError as exc:
        raise ModelFileError(f"model file not found: {path}") from exc
    except (OSError, ValueError, struct.error) as exc:
        raise ModelFileError(f"{path} is not a readable GGUF file: {exc}") from exc


# GGUF value types: struct format of the fixed-size ones; 8 is a string, 9 an array.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's, before its bytes


def _read_header(f: BinaryIO) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The metadata (arrays of strings, the tokenizer's, left out) and the tensor infos
    from a GGUF header; raises ValueError for what is not one."""
    if f.read(4) != b"GGUF":
        raise ValueError("no GGUF magic")
    (version,) = _unpack(f, "I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported (2 or later)")
    n_tensors, n_kv = _unpack(f, "QQ")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = _string(f)
        (kind,) = _unpack(f, "I")
        value = _value(f, kind)
        if value is not _SKIPPED:
            metadata[key] = value
    tensors = []
    for _ in range(n_tensors):
        name = _string(f)
        (n_dims,) = _unpack(f, "I")
        dims = _unpack(f, "Q" * n_dims)
        ggml_type, _offset = _unpack(f, "IQ")
        tensors.append(TensorInfo(name, dims, ggml_type))
    return metadata, tensors


_SKIPPED = object()


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _unpack(f, _SCALARS[kind])[0]
    if kind == _STRING:
        return _string(f)
    if kind != _ARRAY:
        raise ValueError(f"unknown GGUF value type {kind}")
    item, count = _unpack(f, "IQ")
    if item in _SCALARS:
        return list(_unpack(f, _SCALARS[item] * count))
    if item == _STRING:  # a vocabulary: hundreds of thousands of strings nobody here reads
        length = _LENGTH.unpack  # a bound method, no format parsed: 60 ms, not 140, for 262k
        for _ in range(count):
            f.seek(length(f.read(8))[0], 1)
        return _SKIPPED
    return [_value(f, item) for _ in range(count)]


def _unpack(f: BinaryIO, fmt: str) -> tuple[Any, ...]:
    layout = "<" + fmt
    data = f.read(struct.calcsize(layout))
    return struct.unpack(layout, data)


def _string(f: BinaryIO) -> str:
    (length,) = _unpack(f, "Q")
    return f.read(length).decode("utf-8", errors="replace")


def model_info(
    metadata: Mapping[str, Any],
    *,
    name: str,
    sha256: str | None,
    file_size: int | None,
    n_params: int | None,
    weights: DecodeWeights | None = None,
) -> ModelInfo:
    """The architecture numbers KV-cache maths needs, from GGUF metadata (key -> value), as
    llama.cpp reads them, and `weights`, the bytes a decode step reads (from the tensor
    infos, which the metadata does not hold). Raises ModelFileError when there is no
    architecture."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{name} has no general.architecture: not a model GGUF")

    def key(suffix: str) -> Any:
        value = metadata.get(f"{arch}.{suffix}")
        if isinstance(value, list):
            # Per-layer arrays (e.g. head_count_kv on some hybrids): the largest bounds memory.
            numbers = [v for v in value if isinstance(v, int | float)]
            return max(numbers) if numbers else None
        return value

    n_layer = key("block_count")
    n_embd = key("embedding_length")
    n_head = key("attention.head_count")
    n_head_kv = key("attention.head_count_kv")
    if n_head_kv is None:
        n_head_kv = n_head  # llama.cpp: no KV head count means no grouped-query attention
    head_dim = n_embd // n_head if n_embd and n_head else None
    file_type = metadata.get("general.file_type")
    quantization = None
    if isinstance(file_type, int):
        quantization = FILE_TYPES.get(file_type)
    sliding_window = key("attention.sliding_window")
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
    head_dim_k = key("attention.key_length") or head_dim
    head_dim_v = key("attention.value_length") or head_dim
    return ModelInfo(
        name=name,
        sha256=sha256,
        quantization=quantization,
        n_params=n_params,
        file_size=file_size,
        n_layer=n_layer,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ctx_train=key("context_length"),
        sliding_window=sliding_window,
        n_swa_layers=_count_swa_layers(pattern, arch, n_layer) if sliding_window else None,
        layers=_kv_layers(metadata, arch, n_layer, n_head_kv, (head_dim_k, head_dim_v))
        if isinstance(n_layer, int)
        else None,
        weight_bytes=weights.weight_bytes if weights else None,
        expert_bytes=weights.expert_bytes if weights else None,
        expert_count=key("expert_count"),
        expert_used_count=key("expert_used_count"),
    )


def _count_swa_layers(pattern: Any, arch: str, n_layer: int | None) -> int | None:
    """Layers that use the sliding window, as llama.cpp's set_swa_pattern decides them."""
    flags = _swa_flags(pattern, arch, n_layer)
    return sum(flags) if flags is not None else None


def _swa_flags(pattern: Any, arch: str, n_layer: int | None) -> list[bool] | None:
    """Whether each layer uses the sliding window: the GGUF's array, or its period (every
    n-th layer attends globally; 0: every layer uses the window), or the architecture's."""
    if isinstance(pattern, list):
        return [bool(is_swa) for is_swa in pattern]
    if pattern is None:
        pattern = _DEFAULT_SWA_PATTERN.get(arch)
    if not isinstance(pattern, int) or n_layer is None:
        return None
    if pattern == 0:
        return [True] * n_layer
    return [il % pattern < pattern - 1 for il in range(n_layer)]


def _kv_layers(
    metadata: Mapping[str, Any],
    arch: str,
    n_layer: int,
    n_head_kv: Any,
    head_dims: tuple[Any, Any],
) -> KvLayers | None:
    """The KV geometry layer by layer, where ModelInfo's scalars cannot say it: KV heads
    that differ by layer (Gemma 4, hybrids' recurrent layers at 0), sliding-window layers
    with head sizes of their own, MLA, next-token-prediction or shared-KV layers, a
    sparse-attention indexer. None for a model whose layers are alike."""

    def get(suffix: str) -> Any:
        return metadata.get(f"{arch}.{suffix}")

    heads = get("attention.head_count_kv")
    per_layer = heads if isinstance(heads, list) else [n_head_kv or 0] * n_layer
    interval = get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and not isinstance(heads, list):
        # Qwen3-Next style hybrids: every interval-th layer attends, the others are
        # recurrent and keep no KV cache (llama.cpp: recurrent unless (il + 1) % interval == 0)
        per_layer = [h if (il + 1) % interval == 0 else 0 for il, h in enumerate(per_layer)]
    swa_dims = (get("attention.key_length_swa"), get("attention.value_length_swa"))
    mla = bool(get("attention.key_length_mla") and get("attention.value_length_mla"))
    nextn, shared = get("nextn_predict_layers") or 0, get("attention.shared_kv_layers") or 0
    indexer = get("attention.indexer.key_length")
    indexer_types = get("attention.indexer.types")
    differs = len(set(per_layer)) > 1 or any(
        dim is not None and dim != full for dim, full in zip(swa_dims, head_dims, strict=True)
    )
    if not (differs or mla or nextn or shared or indexer):
        return None
    if len(per_layer) != n_layer:
        raise ModelFileError(
            f"{arch}.attention.head_count_kv has {len(per_layer)} layers, block_count {n_layer}"
        )
    window = get("attention.sliding_window")
    flags = _swa_flags(get("attention.sliding_window_pattern"), arch, n_layer) if window else None
    for name, given in (("sliding_window_pattern", flags), ("indexer.types", indexer_types)):
        if isinstance(given, list) and len(given) != n_layer:
            raise ModelFileError(f"{arch} {name} has {len(given)} layers, block_count {n_layer}")
    try:
        return KvLayers(
            architecture=arch,
            head_count_kv=[int(h) for h in per_layer],
            sliding_window_layers=flags,
            head_dim_k_swa=swa_dims[0],
            head_dim_v_swa=swa_dims[1],
            mla=mla,
            nextn_layers=nextn,
            shared_kv_layers=shared,
            indexer_head_dim=indexer,
            indexer_layers=[bool(t) for t in indexer_types]
            if isinstance(indexer_types, list)
            else None,
        )
    except ValidationError as exc:
        raise ModelFileError(f"{arch}'s per-layer facts do not agree: {exc}") from exc
