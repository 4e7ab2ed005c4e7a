from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fleetbench.agent.gguf_model import ModelFileError, describe_gguf
from tests.agent.tiny_gguf import write_tiny_gguf


def test_describe_reads_architecture_numbers_and_digest(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny-Q4_K_M.gguf")
    info = describe_gguf(path)
    assert info.name == "tiny-Q4_K_M"
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.quantization == "Q4_K_M"
    assert info.n_params == 32 * 64 + 64
    assert info.file_size == path.stat().st_size
    assert (info.n_layer, info.n_head_kv, info.head_dim_k, info.head_dim_v) == (18, 1, 32, 32)
    assert (info.n_ctx_train, info.sliding_window) == (32768, 512)
    # gemma3 without an explicit pattern: llama.cpp's default, every 6th layer global
    assert info.n_swa_layers == 15


@pytest.mark.parametrize(
    ("pattern", "expected"), [(2, 9), (0, 18), ([True, False] * 9, 9), ([False] * 18, 0)]
)
def test_sliding_window_pattern_from_metadata(
    tmp_path: Path, pattern: int | list[bool], expected: int
) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", swa_pattern=pattern)
    assert describe_gguf(path, name="m").n_swa_layers == expected


def test_missing_and_corrupt_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        describe_gguf(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a gguf file" * 10)
    with pytest.raises(ModelFileError, match="not a readable GGUF"):
        describe_gguf(junk)
