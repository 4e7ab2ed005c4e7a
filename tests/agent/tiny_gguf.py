"""Tiny GGUF files written with the `gguf` package, for tests that need a real model file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "gemma3",
    n_layer: int = 18,
    swa_pattern: int | list[bool] | None = None,
    head_count_kv: int | list[int] = 1,
    numbers: dict[str, int] | None = None,
) -> Path:
    """A model file of `arch` with no weights worth loading: its header for the reader.
    `numbers`: more `<arch>.<key>` = integer keys."""
    writer = GGUFWriter(path, arch)
    writer.add_name("tiny")
    writer.add_block_count(n_layer)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(head_count_kv)
    for key, value in (numbers or {}).items():
        writer.add_uint32(f"{arch}.{key}", value)
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


def write_tiny_llama(
    path: Path,
    *,
    n_vocab: int = 320,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx: int = 2048,
) -> Path:
    """A llama-architecture model that llama.cpp loads and runs (random f32 weights, a
    vocabulary of the 256 bytes and a few words, so any text tokenizes): a sweep on it takes
    about a second."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, "llama")
    w.add_name("tiny-llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    byte_tokens = [f"<0x{b:02X}>".encode() for b in range(256)]
    words = [f"t{i}".encode() for i in range(n_vocab - 3 - 256)]
    w.add_token_list([b"<unk>", b"<s>", b"</s>", *byte_tokens, *words])
    w.add_token_scores([0.0] * n_vocab)
    # unknown, control, control, byte (the fallback for any text), then normal words
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(words))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    head_dim = n_embd // n_head
    t("token_embd.weight", n_vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    t("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        t(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd)
        t(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd)
        t(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_mixed(path: Path, *, tied: bool = False, experts: bool = False) -> Path:
    """A one-layer model of 256-wide rows whose tensors are of several ggml types, each
    size known by hand: token_embd F16 256 x 32 (16384 bytes), output Q8_0 256 x 32 (32
    rows of 8 blocks of 34: 8704; left out when `tied`), output_norm and attn_norm F32
    (1024 each), attn_q Q4_K 256 x 256 (256 rows of one 144-byte block: 36864), ffn_down
    Q6_K 256 x 256 (256 x 210: 53760). With `experts`, a mixture of 4 experts (2 used) in
    its place: ffn_{gate,up}_exps Q8_0 256 x 64 x 4 (256 rows of 272 bytes: 69632 each),
    ffn_down_exps Q8_0 64 x 256 x 4 (1024 rows of 68: 69632), a shared expert's
    ffn_gate_shexp F16 256 x 64 (32768) and the router's ffn_gate_inp F32 256 x 4 (4096)."""
    arch = "qwen2moe" if experts else "llama"
    w = GGUFWriter(path, arch)
    w.add_name("tiny-mixed")
    w.add_block_count(1)
    w.add_embedding_length(256)
    w.add_head_count(2)
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    if experts:
        w.add_expert_count(4)
        w.add_expert_used_count(2)

    def quantized(name: str, rows: int, row_bytes: int, kind: GGMLQuantizationType) -> None:
        # quantized data is given as bytes, a row of blocks each; the writer works out the
        # elements from the type's block size
        w.add_tensor(name, np.zeros((rows, row_bytes), dtype=np.uint8), raw_dtype=kind)

    w.add_tensor("token_embd.weight", np.zeros((32, 256), dtype=np.float16))
    if not tied:
        quantized("output.weight", 32, 8 * 34, GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(256, dtype=np.float32))
    quantized("blk.0.attn_q.weight", 256, 144, GGMLQuantizationType.Q4_K)
    if experts:
        w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((4, 256), dtype=np.float32))
        w.add_tensor("blk.0.ffn_gate_shexp.weight", np.zeros((64, 256), dtype=np.float16))
        for name in ("ffn_gate_exps", "ffn_up_exps"):
            w.add_tensor(
                f"blk.0.{name}.weight",
                np.zeros((4, 64, 8 * 34), dtype=np.uint8),
                raw_dtype=GGMLQuantizationType.Q8_0,
            )
        w.add_tensor(
            "blk.0.ffn_down_exps.weight",
            np.zeros((4, 256, 2 * 34), dtype=np.uint8),
            raw_dtype=GGMLQuantizationType.Q8_0,
        )
    else:
        quantized("blk.0.ffn_down.weight", 256, 210, GGMLQuantizationType.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
