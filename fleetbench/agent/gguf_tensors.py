"""What a GGUF's tensors weigh, and which of them a decode step reads.

Decode is memory-bound: each step reads the active weights once, so the bytes per step over
a device's peak bandwidth is the floor of its time (memory-bandwidth utilisation, MBU). The
bytes come from each tensor's shape and ggml type: a type stores its elements in blocks of a
fixed size (ggml/src/ggml.c's type_traits; the gguf package's GGML_QUANT_SIZES).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["GGML_TYPES", "DecodeWeights", "TensorInfo", "decode_weights", "tensor_bytes"]

# ggml type id -> (elements per block, bytes per block), as ggml's type_traits gives them.
# A table of our own for the reason FILE_TYPES is (gguf_model.py): importing gguf loads numpy
# into the engine's process. Tests check it against the package, type by type. Ids ggml has
# retired are left out (4, 5: Q4_2, Q4_3; 31-33, 36-38: Q4_0 and IQ4_NL repacked for a CPU,
# now done at load time): a tensor of a type not here has no size we would vouch for.
GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 40),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
    40: (64, 36),  # NVFP4
    41: (128, 18),  # Q1_0
}

# Tables a step reads one row of (a token's, a position's), not whole: llama.cpp's get_rows.
_LOOKUP_TABLES = frozenset(
    {
        "token_embd.weight",
        "per_layer_token_embd.weight",
        "position_embd.weight",
        "token_types.weight",
    }
)
_EMBEDDING, _OUTPUT = "token_embd.weight", "output.weight"
# A mixture of experts' routed experts: blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,bias}
# (llama.cpp's LLM_TENSOR_FFN_*_EXPS); shared experts are `_shexp`, read whole every step.
_ROUTED_EXPERTS = "_exps"


class TensorInfo(NamedTuple):
    """One entry of a GGUF's tensor infos: its name, its dimensions (ne0 first) and type."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int


@dataclass(frozen=True)
class DecodeWeights:
    """The tensors' bytes a decode step reads: `weight_bytes` whole every step,
    `expert_bytes` (all routed experts, 0 for a dense model) in the part the router picks."""

    weight_bytes: int
    expert_bytes: int


def tensor_bytes(tensor: TensorInfo) -> int | None:
    """The tensor's bytes in the file (ggml_nbytes): whole blocks along its rows. None for
    a type this table does not know, or rows that do not fill whole blocks (ggml refuses
    those: not a tensor ggml wrote)."""
    block = GGML_TYPES.get(tensor.ggml_type)
    if block is None or not tensor.dims:
        return None
    elements, size = block
    row, *rest = tensor.dims
    if row % elements:
        return None
    return row // elements * size * math.prod(rest)


def decode_weights(
    tensors: Iterable[TensorInfo], metadata: Mapping[str, Any]
) -> DecodeWeights | None:
    """What a decode step reads of these tensors, by name: every layer's and the output's
    whole; the token embedding whole only where the output is tied to it (no `output.weight`:
    llama.cpp's output matmul then reads the embedding), else one row of it, left out like
    every lookup table's; routed experts apart. A next-token-prediction layer
    (`nextn_predict_layers`, the last ones) is left out: llama.cpp skips loading it. None
    where a tensor's size is unknown, or the file is one part of a split model (its tensors
    are not all here): a partial sum would read as a figure."""
    split = metadata.get("split.count")
    if isinstance(split, int) and split > 1:
        return None
    listed = list(tensors)
    skipped = _skipped_layers(metadata)
    tied = all(tensor.name != _OUTPUT for tensor in listed)
    weight = expert = 0
    for tensor in listed:
        size = tensor_bytes(tensor)
        if size is None:
            return None
        if tensor.name in _LOOKUP_TABLES and not (tied and tensor.name == _EMBEDDING):
            continue
        if _layer(tensor.name) in skipped:
            continue
        if _ROUTED_EXPERTS in tensor.name:
            expert += size
        else:
            weight += size
    return DecodeWeights(weight_bytes=weight, expert_bytes=expert)


def _skipped_layers(metadata: Mapping[str, Any]) -> range:
    """The next-token-prediction layers, which llama.cpp loads with TENSOR_SKIP."""
    arch = metadata.get("general.architecture")
    n_layer = metadata.get(f"{arch}.block_count")
    nextn = metadata.get(f"{arch}.nextn_predict_layers")
    if isinstance(n_layer, int) and isinstance(nextn, int) and 0 < nextn <= n_layer:
        return range(n_layer - nextn, n_layer)
    return range(0)


def _layer(name: str) -> int | None:
    """N of a `blk.N.` tensor."""
    prefix, _, rest = name.partition(".")
    number = rest.partition(".")[0]
    return int(number) if prefix == "blk" and number.isdigit() else None
