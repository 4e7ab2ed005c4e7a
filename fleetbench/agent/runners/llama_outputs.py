"""The model's output fingerprint (contract.outputs) through llama.cpp's C API, in the engine's
process after the timed points: the reference text decoded in chunks in a context of its
own, each chunk's logits reduced to the top tokens' log-probabilities at once (a chunk of
CHUNK positions holds CHUNK x n_vocab floats: 34 MB for Gemma 3's 262,144 tokens, where the
whole text's would be ten times that). numpy is imported only here, when the points are
done: its threads would share the cores the timed loop measures."""

from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING, Any

from fleetbench.contract.outputs import (
    LEAST_LOGPROB,
    REFERENCE_TEXT,
    TEXT_VERSION,
    TOP_K,
    OutputFingerprint,
    rest_of,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CHUNK", "output_fingerprint", "reduce_rows", "tokenize"]

CHUNK = 32


def tokenize(llama: Any, vocab: Any, text: str) -> list[int]:
    """The text's tokens as the model's vocabulary splits it, with its start token."""
    data = text.encode()
    room = len(data) + 16
    tokens = (llama.llama_token * room)()
    count = int(llama.llama_tokenize(vocab, data, len(data), tokens, room, True, False))
    if count < 0:
        raise ValueError(f"the reference text needs {-count} tokens, more than {room}")
    return list(tokens[:count])


def output_fingerprint(llama: Any, model: Any, *, n_threads: int) -> OutputFingerprint:
    """The model's fingerprint on REFERENCE_TEXT: a context of its own, decoded in chunks
    with every position's logits; raises RuntimeError where llama.cpp cannot."""
    began = time.monotonic()
    numpy = importlib.import_module("numpy")
    vocab = llama.llama_model_get_vocab(model)
    n_vocab = int(llama.llama_vocab_n_tokens(vocab))
    tokens = tokenize(llama, vocab, REFERENCE_TEXT)
    params = llama.llama_context_default_params()
    params.n_ctx = len(tokens)
    params.n_batch = params.n_ubatch = CHUNK
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = n_threads
    ctx = llama.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context of {len(tokens)} cells")
    batch = llama.llama_batch_init(CHUNK, 0, 1)
    ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    rest: list[float] = []
    non_finite = 0
    try:
        # the last position predicts nothing the text holds: its distribution is not kept
        for start in range(0, len(tokens) - 1, CHUNK):
            chunk = tokens[start : min(start + CHUNK, len(tokens) - 1)]
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = len(chunk)
            if (status := int(llama.llama_decode(ctx, batch))) != 0:
                raise RuntimeError(f"llama_decode returned {status} on the reference text")
            logits = llama.llama_get_logits(ctx)
            rows = numpy.ctypeslib.as_array(logits, shape=(len(chunk), n_vocab))
            non_finite += reduce_rows(rows, ids, logprobs, rest)  # llama.cpp's float32
    finally:
        llama.llama_batch_free(batch)
        llama.llama_free(ctx)
    return OutputFingerprint(
        text_version=TEXT_VERSION,
        n_vocab=n_vocab,
        ids=ids,
        logprobs=logprobs,
        rest=rest,
        seconds=time.monotonic() - began,
        non_finite=non_finite,
    )


def reduce_rows(
    rows: np.ndarray[Any, Any], ids: list[list[int]], logprobs: list[list[float]], rest: list[float]
) -> int:
    """Each row's top TOP_K log-probabilities (log-softmax), likeliest first, and the log of
    what is left, appended; the number of rows with a logit that is no finite number (a
    broken kernel's: NaN and infinities are taken as the least logit, so that the row still
    has a distribution to compare)."""
    numpy = importlib.import_module("numpy")
    finite = numpy.isfinite(rows)
    broken = int((~finite.all(axis=1)).sum())
    if broken:
        rows = numpy.where(finite, rows, numpy.finfo(rows.dtype).min / 2)
    n = rows.shape[1]
    k = min(TOP_K, n)
    # the largest k, unordered (a whole row's sort where it holds no more than k)
    top = numpy.argpartition(rows, n - k, axis=1)[:, n - k :] if k < n else numpy.argsort(rows)
    peak = rows.max(axis=1, keepdims=True)
    shifted = rows - peak  # the one copy of the chunk: exp in place, summed in float64
    numpy.exp(shifted, out=shifted)
    log_total = peak[:, 0].astype(numpy.float64) + numpy.log(
        shifted.sum(axis=1, dtype=numpy.float64)
    )
    for row, picked, total in zip(rows, top, log_total, strict=True):
        ordered = picked[numpy.argsort(-row[picked], kind="stable")]
        chosen = [
            min(max(float(lp), LEAST_LOGPROB), 0.0)
            for lp in row[ordered].astype(numpy.float64) - total
        ]
        ids.append([int(i) for i in ordered])
        logprobs.append([round(lp, 5) for lp in chosen])
        rest.append(round(rest_of(chosen), 5))
    return broken
