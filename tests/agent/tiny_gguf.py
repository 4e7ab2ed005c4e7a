"""Tiny GGUF files written with the `gguf` package, for tests that need a real model file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "gemma3",
    n_layer: int = 18,
    swa_pattern: int | list[bool] | None = None,
) -> Path:
    writer = GGUFWriter(path, arch)
    writer.add_name("tiny")
    writer.add_block_count(n_layer)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(1)
    writer.add_key_length(32)
    writer.add_value_length(32)
    writer.add_context_length(32768)
    writer.add_sliding_window(512)
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_K_M)
    if isinstance(swa_pattern, int):
        writer.add_uint32(f"{arch}.attention.sliding_window_pattern", swa_pattern)
    elif swa_pattern is not None:
        writer.add_array(f"{arch}.attention.sliding_window_pattern", swa_pattern)
    writer.add_tensor("token_embd.weight", np.ones((32, 64), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
