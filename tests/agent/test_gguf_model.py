from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fleetbench.agent.gguf_model import FILE_TYPES, ModelFileError, describe_gguf, model_info
from fleetbench.contract.kv_cache import kv_cache_bytes
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


def test_layers_that_differ_are_read_layer_by_layer(tmp_path: Path) -> None:
    """Gemma 4's shape: sliding-window layers with 8 KV heads of 256, every sixth layer a
    full one with 1 head of 512; a model whose layers are alike has no per-layer facts."""
    heads, windows = [8, 8, 8, 8, 8, 1] * 2, [True] * 5 + [False]
    path = write_tiny_gguf(
        tmp_path / "g4.gguf",
        arch="gemma4",
        n_layer=12,
        swa_pattern=windows * 2,
        head_count_kv=heads,
        numbers={"attention.key_length_swa": 16, "attention.value_length_swa": 16},
    )
    layers = describe_gguf(path).layers
    assert layers is not None
    assert (layers.architecture, layers.head_count_kv) == ("gemma4", heads)
    assert layers.sliding_window_layers == windows * 2
    assert (layers.head_dim_k_swa, layers.head_dim_v_swa, layers.mla) == (16, 16, False)
    assert describe_gguf(write_tiny_gguf(tmp_path / "alike.gguf")).layers is None
    # arrays that do not cover every layer are the file's error, named
    odd = write_tiny_gguf(tmp_path / "odd.gguf", arch="gemma4", head_count_kv=[8, 1])
    with pytest.raises(ModelFileError, match="head_count_kv has 2 layers, block_count 18"):
        describe_gguf(odd)


def test_missing_and_corrupt_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        describe_gguf(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a gguf file" * 10)
    with pytest.raises(ModelFileError, match="not a readable GGUF"):
        describe_gguf(junk)


def test_a_hybrid_s_recurrent_layers_keep_no_kv_cache() -> None:
    """Qwen3-Next style: one KV head count for all, every 4th layer attends
    (`full_attention_interval`), the others are recurrent."""
    metadata = {
        "general.architecture": "qwen3next",
        "qwen3next.block_count": 8,
        "qwen3next.attention.head_count": 16,
        "qwen3next.attention.head_count_kv": 2,
        "qwen3next.attention.key_length": 256,
        "qwen3next.attention.value_length": 256,
        "qwen3next.full_attention_interval": 4,
    }
    info = model_info(metadata, name="m", sha256=None, file_size=None, n_params=None)
    assert info.layers is not None
    assert info.layers.head_count_kv == [0, 0, 0, 2, 0, 0, 0, 2]
    # 2 attention layers x 2 heads x (256 + 256) x 2 bytes per cell
    assert kv_cache_bytes(info, n_ctx=4096) == 4096 * 2 * 2 * 512 * 2


def test_per_layer_facts_that_disagree_are_the_file_s_error() -> None:
    metadata = {
        "general.architecture": "glm4moe",
        "glm4moe.block_count": 2,
        "glm4moe.attention.head_count": 4,
        "glm4moe.attention.head_count_kv": 1,
        "glm4moe.attention.key_length": 64,
        "glm4moe.attention.value_length": 64,
        "glm4moe.nextn_predict_layers": 3,
    }
    with pytest.raises(ModelFileError, match="per-layer facts do not agree"):
        model_info(metadata, name="m", sha256=None, file_size=None, n_params=None)


def test_file_types_are_named_as_the_gguf_package_names_them() -> None:
    from gguf import LlamaFileType

    named = {t.value: t.name.removeprefix("MOSTLY_") for t in LlamaFileType}
    assert {value: named.get(value) for value in FILE_TYPES} == FILE_TYPES
    assert FILE_TYPES[15] == "Q4_K_M" and FILE_TYPES[1] == "F16"
