"""KV-cache arithmetic, checked against the batching article's figures."""

from __future__ import annotations

from typing import get_args

import pytest

from fleetbench.contract.kv_cache import (
    CACHE_TYPE_BYTES,
    CacheShape,
    CacheType,
    fits,
    kv_cache_bytes,
)
from fleetbench.contract.wire import ModelInfo
from tests.factories import ARTICLE_MODEL_INFO

NEMO = ARTICLE_MODEL_INFO  # Mistral NeMo 12B: 40 layers, 8 KV heads of 128
GIB = 2**30


def test_article_32_streams_of_640_tokens_need_about_3_1_gib() -> None:
    assert kv_cache_bytes(NEMO, n_ctx=20_480) / GIB == pytest.approx(3.125)  # type: ignore[operator]


def test_article_32_users_with_8000_token_conversations_need_about_39_gib() -> None:
    assert kv_cache_bytes(NEMO, n_ctx=32 * 8000) / GIB == pytest.approx(39.06, abs=0.01)  # type: ignore[operator]


def test_quantised_cache_types_shrink_it() -> None:
    f16 = kv_cache_bytes(NEMO, n_ctx=20_480)
    q8 = kv_cache_bytes(NEMO, n_ctx=20_480, cache_type_k="q8_0", cache_type_v="q8_0")
    assert q8 / f16 == pytest.approx(34 / 64)  # type: ignore[operator]


def test_sliding_window_layers_keep_only_their_window() -> None:
    gemma = ModelInfo(  # Gemma 3 270M, as its GGUF describes it
        name="gemma-3-270m", n_layer=18, n_head_kv=1, head_dim_k=256, head_dim_v=256,
        sliding_window=512, n_swa_layers=15,
    )  # fmt: skip
    per_cell_layer = 1 * (256 * 2 + 256 * 2)
    # 3 global layers keep 2048 cells; 15 window layers keep 512 + one 512-token micro-batch
    assert kv_cache_bytes(gemma, n_ctx=2048) == per_cell_layer * (3 * 2048 + 15 * 1024)
    # with 8 sequences, each keeps its own window, up to the whole context
    assert kv_cache_bytes(gemma, n_ctx=2048, n_seq=8) == per_cell_layer * 18 * 2048


def test_without_architecture_numbers_nothing_is_claimed() -> None:
    assert kv_cache_bytes(ModelInfo(name="mystery"), n_ctx=4096) is None


def test_fits_says_why_not() -> None:
    small, large = CacheShape(n_ctx=20_480, n_seq=32), CacheShape(n_ctx=256_000, n_seq=32)
    assert fits(NEMO, small, free_bytes=24 * GIB) is None
    reason = fits(NEMO, large, free_bytes=24 * GIB)
    # 32 separate sequences of 8000 cells, each padded to 8192 (llama.cpp b6975+): 40 GiB
    assert reason == (
        "its KV cache for 256000 cells needs 40.00 GiB beside 6.96 GiB of weights; "
        "24.00 GiB is free"
    )
    assert fits(NEMO, large, free_bytes=None) is None


def test_a_cache_type_the_table_lacks_gives_no_estimate_and_upper_case_is_read() -> None:
    assert kv_cache_bytes(NEMO, n_ctx=1024, cache_type_k="q3_weird") is None
    assert kv_cache_bytes(NEMO, n_ctx=1024, cache_type_k="Q8_0") == kv_cache_bytes(
        NEMO, n_ctx=1024, cache_type_k="q8_0"
    )


def test_every_cache_type_a_spec_takes_has_a_size() -> None:
    assert set(get_args(CacheType)) == set(CACHE_TYPE_BYTES)


def test_a_model_of_any_layer_count_is_sized_at_once() -> None:
    """Layers alike are counted, not listed: a report claiming 2^31 - 1 layers costs the
    registry no more than one of 40."""
    huge = NEMO.model_copy(update={"n_layer": 2**31 - 1})
    per_layer_cell = 8 * 128 * 2 * 2
    assert kv_cache_bytes(huge, n_ctx=256) == 256 * (2**31 - 1) * per_layer_cell
