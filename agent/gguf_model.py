"""Describe a GGUF model file: its sha256 and the architecture numbers KV-cache maths needs.

Reads metadata with the `gguf` package (imported lazily: it pulls in numpy).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.wire import ModelInfo

__all__ = ["ModelFileError", "describe_gguf", "model_info", "sha256_of"]

# Where a GGUF has no `<arch>.attention.sliding_window_pattern`, llama.cpp assumes a pattern
# per architecture (every n-th layer attends globally); these are its defaults for the
# common sliding-window families (src/models/<arch>.cpp, load_swa_pattern).
_DEFAULT_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2}

_HASH_CHUNK = 1 << 20


class ModelFileError(ValueError):
    """The model file is missing, unreadable or not a GGUF file."""


def sha256_of(path: Path, *, cache: Path | None = None) -> str:
    """The file's SHA-256. With `cache` (a JSON file), a file whose path, size and mtime
    are unchanged is not read again: a 20 GB model is hashed once, not every night."""
    stat = path.stat()
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
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
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


def describe_gguf(
    path: Path, *, name: str | None = None, sha256_cache: Path | None = None
) -> ModelInfo:
    """ModelInfo for a GGUF file read with the `gguf` package (slow for large vocabularies:
    sweeps take the same numbers from llama.cpp, which loads the model anyway);
    `name` defaults to the file name without `.gguf`."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except FileNotFoundError as exc:
        raise ModelFileError(f"model file not found: {path}") from exc
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{path} is not a readable GGUF file: {exc}") from exc
    metadata = {
        key: _plain(field.contents())
        for key, field in reader.fields.items()
        if not key.startswith("tokenizer.")
    }
    return model_info(
        metadata,
        name=name or path.name.removesuffix(".gguf"),
        sha256=sha256_of(path, cache=sha256_cache),
        file_size=path.stat().st_size,
        n_params=sum(int(t.n_elements) for t in reader.tensors),
    )


def model_info(
    metadata: Mapping[str, Any],
    *,
    name: str,
    sha256: str | None,
    file_size: int | None,
    n_params: int | None,
) -> ModelInfo:
    """The architecture numbers KV-cache maths needs, from GGUF metadata (key -> value), as
    llama.cpp reads them. Raises ModelFileError when there is no architecture."""
    from gguf import LlamaFileType

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
        try:
            quantization = LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            quantization = None
    sliding_window = key("attention.sliding_window")
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
    return ModelInfo(
        name=name,
        sha256=sha256,
        quantization=quantization,
        n_params=n_params,
        file_size=file_size,
        n_layer=n_layer,
        n_head_kv=n_head_kv,
        head_dim_k=key("attention.key_length") or head_dim,
        head_dim_v=key("attention.value_length") or head_dim,
        n_ctx_train=key("context_length"),
        sliding_window=sliding_window,
        n_swa_layers=_count_swa_layers(pattern, arch, n_layer) if sliding_window else None,
    )


def _count_swa_layers(pattern: Any, arch: str, n_layer: int | None) -> int | None:
    """Layers that use the sliding window, as llama.cpp's set_swa_pattern decides them."""
    if isinstance(pattern, list):
        return sum(bool(is_swa) for is_swa in pattern)
    if pattern is None:
        pattern = _DEFAULT_SWA_PATTERN.get(arch)
    if not isinstance(pattern, int) or n_layer is None:
        return None
    if pattern == 0:
        return n_layer
    return sum(1 for il in range(n_layer) if il % pattern < pattern - 1)


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value
