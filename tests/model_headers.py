"""Header-only GGUFs of real models: the metadata and tensor infos of a published file, and
no tensor data (a few KB), for tests of what is read from a header at full scale.

Where each figure comes from:

- Mistral NeMo 12B (Mistral-Nemo-Instruct-2407): the shapes are those of the model's
  config.json on Hugging Face (mistralai/Mistral-Nemo-Instruct-2407: hidden_size 5120, 40
  layers, 32 heads of head_dim 128, 8 KV heads, intermediate_size 14336, vocab_size 131072,
  rope_theta 1e6, rms_norm_eps 1e-5, tie_word_embeddings false); the GGUF keys as llama.cpp's
  convert_hf_to_gguf.py writes them for the `llama` architecture (a published GGUF's loader
  log, legraphista/Mistral-Nemo-Instruct-2407-IMat-GGUF's imatrix.log: 363 tensors,
  context_length 1024000). The published Q4_K_M (bartowski/Mistral-Nemo-Instruct-2407-GGUF)
  is listed at 7.48 GB.
- Qwen3-30B-A3B: the shapes of Qwen/Qwen3-30B-A3B's config.json (hidden_size 2048, 48
  layers, 32 heads and 4 KV heads of 128, 128 experts of moe_intermediate_size 768, 8 used
  per token, vocab_size 151936, untied output) and the `qwen3moe` keys of a published GGUF
  (Ollama's listing of a Q8_0: expert_feed_forward_length 768, context_length 40960,
  attn_q_norm/attn_k_norm of 128, an F32 router ffn_gate_inp). Its Q4_K_M weighs 17.28 GB
  as a model card comparing with it gives it (GOBA-AI-Labs/PrunedHub-Qwen3-30B-A3B-EN-80pct-
  MxMoE): GiB, 18.55e9 bytes.
- The tensor types: llama.cpp's Q4_K_M recipe (src/llama-quant.cpp,
  llama_tensor_get_type_impl), without an imatrix or overrides: every 2-D weight Q4_K; the
  output Q6_K; attn_v and ffn_down (ffn_down_exps too) Q6_K on the layers `use_more_bits`
  picks (the first and last eighth, and every third between), Q4_K on the others; norms,
  and the MoE router, F32 (not quantized).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType

Q4_K, Q6_K, F32 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.F32

# A tensor: its name, its shape as ggml lists it (ne0, the row, first) and its type.
Tensor = tuple[str, tuple[int, ...], GGMLQuantizationType]


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down a Q4_K_M keeps at Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def nbytes(shape: tuple[int, ...], kind: GGMLQuantizationType) -> int:
    """The tensor's bytes, by the gguf package's block sizes (the reader under test has its
    own table)."""
    elements, size = GGML_QUANT_SIZES[kind]
    count = 1
    for dim in shape:
        count *= dim
    return count // elements * size


def mistral_nemo_tensors() -> Iterator[Tensor]:
    """Mistral NeMo 12B Q4_K_M's 363 tensors."""
    n_embd, n_ff, n_layer, n_vocab, kv = 5120, 14336, 40, 131072, 8 * 128
    yield "token_embd.weight", (n_embd, n_vocab), Q4_K
    for i in range(n_layer):
        more = Q6_K if use_more_bits(i, n_layer) else Q4_K
        yield f"blk.{i}.attn_norm.weight", (n_embd,), F32
        yield f"blk.{i}.ffn_down.weight", (n_ff, n_embd), more
        yield f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), Q4_K
        yield f"blk.{i}.ffn_up.weight", (n_embd, n_ff), Q4_K
        yield f"blk.{i}.ffn_norm.weight", (n_embd,), F32
        yield f"blk.{i}.attn_k.weight", (n_embd, kv), Q4_K
        yield f"blk.{i}.attn_output.weight", (32 * 128, n_embd), Q4_K
        yield f"blk.{i}.attn_q.weight", (n_embd, 32 * 128), Q4_K
        yield f"blk.{i}.attn_v.weight", (n_embd, kv), more
    yield "output.weight", (n_embd, n_vocab), Q6_K
    yield "output_norm.weight", (n_embd,), F32


def qwen3_30b_a3b_tensors() -> Iterator[Tensor]:
    """Qwen3-30B-A3B Q4_K_M's 579 tensors: attention, and 128 routed experts a layer, no
    shared expert."""
    n_embd, n_ff_exp, n_expert, n_layer, n_vocab = 2048, 768, 128, 48, 151936
    q, kv = 32 * 128, 4 * 128
    yield "token_embd.weight", (n_embd, n_vocab), Q4_K
    for i in range(n_layer):
        more = Q6_K if use_more_bits(i, n_layer) else Q4_K
        yield f"blk.{i}.attn_norm.weight", (n_embd,), F32
        yield f"blk.{i}.attn_q.weight", (n_embd, q), Q4_K
        yield f"blk.{i}.attn_k.weight", (n_embd, kv), Q4_K
        yield f"blk.{i}.attn_v.weight", (n_embd, kv), more
        yield f"blk.{i}.attn_output.weight", (q, n_embd), Q4_K
        yield f"blk.{i}.attn_q_norm.weight", (128,), F32
        yield f"blk.{i}.attn_k_norm.weight", (128,), F32
        yield f"blk.{i}.ffn_norm.weight", (n_embd,), F32
        yield f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), F32
        yield f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), Q4_K
        yield f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), Q4_K
        yield f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), more
    yield "output.weight", (n_embd, n_vocab), Q6_K
    yield "output_norm.weight", (n_embd,), F32


def write_mistral_nemo_q4_k_m(path: Path) -> Path:
    """The header of Mistral-Nemo-Instruct-2407-Q4_K_M.gguf (no tokenizer, no data)."""
    writer = GGUFWriter(path, "llama")
    writer.add_name("Mistral Nemo Instruct 2407")
    writer.add_block_count(40)
    writer.add_context_length(1024000)
    writer.add_embedding_length(5120)
    writer.add_feed_forward_length(14336)
    writer.add_head_count(32)
    writer.add_head_count_kv(8)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_key_length(128)
    writer.add_value_length(128)
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_vocab_size(131072)
    writer.add_rope_dimension_count(128)
    return _write_header(writer, path, mistral_nemo_tensors())


def write_qwen3_30b_a3b_q4_k_m(path: Path) -> Path:
    """The header of Qwen3-30B-A3B-Q4_K_M.gguf (no tokenizer, no data)."""
    writer = GGUFWriter(path, "qwen3moe")
    writer.add_name("Qwen3 30B A3B")
    writer.add_block_count(48)
    writer.add_context_length(40960)
    writer.add_embedding_length(2048)
    writer.add_feed_forward_length(6144)
    writer.add_head_count(32)
    writer.add_head_count_kv(4)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_used_count(8)
    writer.add_key_length(128)
    writer.add_value_length(128)
    writer.add_expert_count(128)
    writer.add_expert_feed_forward_length(768)
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_K_M)
    return _write_header(writer, path, qwen3_30b_a3b_tensors())


def _write_header(writer: GGUFWriter, path: Path, tensors: Iterator[Tensor]) -> Path:
    """Header, metadata and tensor infos (their offsets as the data would lie), no data."""
    for name, shape, kind in tensors:
        # the writer takes numpy's order (ne0 last) and, with a non-byte dtype, elements
        writer.add_tensor_info(
            name, tuple(reversed(shape)), np.dtype(np.float32), nbytes(shape, kind), kind
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path
