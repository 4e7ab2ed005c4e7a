from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fleetbench.agent.gguf_model import (
    FILE_TYPES,
    ModelFileError,
    _read_header,
    describe_gguf,
    model_info,
)
from fleetbench.agent.gguf_tensors import GGML_TYPES, DecodeWeights, TensorInfo, decode_weights
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.contract.kv_cache import kv_cache_bytes
from fleetbench.contract.sweep_spec import SweepSpec
from tests.agent.tiny_gguf import write_tiny_gguf, write_tiny_mixed
from tests.model_headers import (
    mistral_nemo_tensors,
    use_more_bits,
    write_mistral_nemo_q4_k_m,
    write_qwen3_30b_a3b_q4_k_m,
)


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


def test_ggml_types_are_sized_as_the_gguf_package_sizes_them() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    known = {t.value: GGML_QUANT_SIZES[t] for t in GGMLQuantizationType}
    assert {value: GGML_TYPES.get(value) for value in known} == known
    assert GGML_TYPES[12] == (256, 144) and GGML_TYPES[14] == (256, 210)  # Q4_K, Q6_K


@pytest.mark.parametrize(
    ("tied", "expected"),
    [
        # output Q8_0 8704 + norms 2 x 1024 + attn_q Q4_K 36864 + ffn_down Q6_K 53760
        (False, 8704 + 2 * 1024 + 36864 + 53760),
        # no output tensor: the output matmul reads the F16 embedding whole, 16384
        (True, 16384 + 2 * 1024 + 36864 + 53760),
    ],
)
def test_a_step_reads_every_layer_and_the_output_and_the_embedding_only_if_tied(
    tmp_path: Path, tied: bool, expected: int
) -> None:
    info = describe_gguf(write_tiny_mixed(tmp_path / "m.gguf", tied=tied))
    assert (info.weight_bytes, info.expert_bytes) == (expected, 0)
    assert (info.expert_count, info.expert_used_count) == (None, None)


def test_routed_experts_are_counted_apart_and_shared_ones_with_the_weights(
    tmp_path: Path,
) -> None:
    info = describe_gguf(write_tiny_mixed(tmp_path / "moe.gguf", experts=True))
    # output 8704, norms 2 x 1024, attn_q 36864, router F32 4096, shared expert F16 32768
    assert info.weight_bytes == 8704 + 2 * 1024 + 36864 + 4096 + 32768
    assert info.expert_bytes == 3 * 69632  # gate, up and down, Q8_0, 4 experts each
    assert (info.expert_count, info.expert_used_count) == (4, 2)


def test_what_cannot_be_sized_gives_no_figure_rather_than_a_guess() -> None:
    q4_k = TensorInfo("blk.0.attn_q.weight", (256, 256), 12)
    assert decode_weights([q4_k], {}) == DecodeWeights(weight_bytes=256 * 144, expert_bytes=0)
    # a type id this table does not know (a retired one), a row that fills no whole block
    assert decode_weights([q4_k, TensorInfo("blk.0.x.weight", (32, 8), 31)], {}) is None
    assert decode_weights([TensorInfo("blk.0.x.weight", (100, 2), 12)], {}) is None
    # one part of a split model holds only some of the tensors
    assert decode_weights([q4_k], {"split.count": 3}) is None


def test_lookup_tables_and_skipped_prediction_layers_are_not_read() -> None:
    """A step reads one row of a per-layer embedding (Gemma 3n) or of learned positions;
    llama.cpp does not load a next-token-prediction layer (GLM 4.5's last, with experts)."""
    f32 = 0
    tensors = [
        TensorInfo("token_embd.weight", (8, 100), f32),
        TensorInfo("output.weight", (8, 100), f32),
        TensorInfo("per_layer_token_embd.weight", (16, 100), f32),
        TensorInfo("position_embd.weight", (8, 50), f32),
        TensorInfo("blk.0.attn_q.weight", (8, 8), f32),
        TensorInfo("blk.0.ffn_up_exps.weight", (8, 4, 2), f32),
        TensorInfo("blk.1.attn_q.weight", (8, 8), f32),
        TensorInfo("blk.1.ffn_up_exps.weight", (8, 4, 2), f32),
    ]
    metadata = {"general.architecture": "glm4moe", "glm4moe.block_count": 2}
    assert decode_weights(tensors, metadata) == DecodeWeights(
        weight_bytes=4 * (800 + 2 * 64), expert_bytes=4 * 2 * 64
    )
    metadata["glm4moe.nextn_predict_layers"] = 1
    assert decode_weights(tensors, metadata) == DecodeWeights(
        weight_bytes=4 * (800 + 64), expert_bytes=4 * 64
    )


def test_gemma_s_weights_are_its_whole_tensor_data(gemma: Path) -> None:
    """Gemma 3 ties its output to the embedding: a step reads every tensor. The tensor data
    is the file less its header, each tensor padded to the file's alignment (32)."""
    info = describe_gguf(gemma)
    with gemma.open("rb") as f:
        metadata, tensors = _read_header(f)
        header = f.tell()
    alignment = metadata.get("general.alignment", 32)
    data = gemma.stat().st_size - (header + -header % alignment)
    assert info.weight_bytes is not None and info.expert_bytes == 0
    assert 0 <= data - info.weight_bytes < alignment * len(tensors)
    assert info.expert_count is None


def test_the_in_process_engine_reports_the_weights_from_the_file_s_header(
    tiny_llama: Path,
) -> None:
    """llama.cpp's metadata has no tensor types: the runner reads them from the header.
    The tiny llama is F32 with its own output: every tensor but the embedding."""
    outcome = LlamaCppPythonRunner().run(tiny_llama, SweepSpec(npp=(8,), ntg=(2,), npl=(1,)))
    assert outcome.model is not None
    n_embd, n_ff, n_kv = 64, 128, 2 * 16
    layer = 2 * n_embd + 2 * n_embd * n_embd + 2 * n_kv * n_embd + 3 * n_ff * n_embd
    assert outcome.model.weight_bytes == 4 * (320 * n_embd + n_embd + 2 * layer)
    assert outcome.model.expert_bytes == 0
    assert outcome.model.weight_bytes == describe_gguf(tiny_llama).weight_bytes


def test_mistral_nemo_q4_k_m_reads_its_published_size_less_the_embedding(
    tmp_path: Path,
) -> None:
    """Mistral NeMo 12B Q4_K_M (tests/model_headers.py): 40 layers, Q6_K attn_v and
    ffn_down on the 20 that use_more_bits picks, a Q6_K output of its own."""
    assert sum(use_more_bits(i, 40) for i in range(40)) == 20
    path = write_mistral_nemo_q4_k_m(tmp_path / "Mistral-Nemo-Instruct-2407-Q4_K_M.gguf")
    assert path.stat().st_size < 64 * 1024
    info = describe_gguf(path)
    assert (info.quantization, info.n_layer, info.n_head_kv, info.n_ctx_train) == (
        "Q4_K_M",
        40,
        8,
        1024000,
    )
    assert info.n_params == 12_247_782_400  # "12.2B"
    q4_k, q6_k = 144 / 256, 210 / 256  # bytes per weight
    attention = (2 * 5120 * 4096 + 5120 * 1024) * q4_k  # q, output, k
    v_and_down = 5120 * 1024 + 14336 * 5120
    mlp = 2 * 5120 * 14336 * q4_k  # gate, up
    layers = 40 * (attention + mlp + 2 * 5120 * 4) + 20 * v_and_down * (q4_k + q6_k)
    output = 5120 * 131072 * q6_k + 5120 * 4
    assert info.weight_bytes == layers + output == 7_091_834_880
    assert info.expert_bytes == 0 and info.expert_count is None
    # the published file: 7.48 GB, its tokenizer (131072 tokens, their merges) in the header
    embedding = 5120 * 131072 * q4_k
    assert 7.475e9 - 20e6 < info.weight_bytes + embedding < 7.485e9
    names = [name for name, _, _ in mistral_nemo_tensors()]
    assert len(names) == len(set(names)) == 363


def test_a_published_mixture_of_experts_reads_its_experts_apart(tmp_path: Path) -> None:
    """Qwen3-30B-A3B Q4_K_M: 48 layers of 128 experts, 8 used per token; its routed
    experts are 95% of the file."""
    info = describe_gguf(write_qwen3_30b_a3b_q4_k_m(tmp_path / "Qwen3-30B-A3B-Q4_K_M.gguf"))
    assert (info.expert_count, info.expert_used_count) == (128, 8)
    assert info.n_params == 30_532_122_624  # "30.5B"
    q4_k, q6_k = 144 / 256, 210 / 256
    expert = 2048 * 768 * 128  # one of gate, up, down: 128 experts
    assert info.expert_bytes == 48 * 2 * expert * q4_k + 24 * expert * (q4_k + q6_k)
    attention = 48 * 2 * 2048 * 4096 * q4_k + 48 * 2048 * 512 * q4_k  # q, output, k
    v = 24 * 2048 * 512 * (q4_k + q6_k)
    small = 48 * 4 * (2 * 2048 + 2 * 128 + 2048 * 128)  # norms and router, F32
    output = 2048 * 151936 * q6_k + 2048 * 4
    assert info.weight_bytes == attention + v + small + output == 822_523_904
    # the published file: 17.28 GiB, of which the Q4_K embedding and the tokenizer
    embedding = 2048 * 151936 * q4_k
    total = info.weight_bytes + info.expert_bytes + embedding
    assert 17.275 * 2**30 - 20e6 < total < 17.285 * 2**30
