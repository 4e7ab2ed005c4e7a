"""The model's output fingerprint (contract.outputs) through a llama-server: the reference
text tokenized by the server (/tokenize, with the model's start token), then, at each
position, a completion of one token asked with `n_probs`: the TOP_K likeliest next tokens'
probabilities before any sampler, llama-server's softmax over the whole vocabulary of the
logits that position's decode gave. The text's prefix stays in the slot's cache
(`cache_prompt`), so each request decodes one token: a few hundred small requests, never the
prefix again each time.

A serving sweep takes it after its levels (serving.sweep); a binary sweep through a
llama-server of its own build started beside llama-batched-bench (runners.binary_outputs).
Here positions are decoded one at a time, in the in-process runner 32 at a time: a matrix
product over one row is not the one over 32, so fingerprints compare within one runner only.
"""

from __future__ import annotations

import math
import time
from typing import Any, TypeGuard

import httpx

from fleetbench.agent.serving.servers import in_flight, json_answer
from fleetbench.contract.outputs import (
    LEAST_LOGPROB,
    MOST_POSITIONS,
    REFERENCE_TEXT,
    TEXT_VERSION,
    TOP_K,
    OutputFingerprint,
    rest_of,
)

__all__ = ["NoFingerprint", "server_fingerprint"]

_REQUEST_S = 60.0  # one position's request: a token's decode, on the slowest node
_BUDGET_S = 900.0  # the whole text: a server this slow is not fingerprinted


class NoFingerprint(Exception):
    """Why the server gave no fingerprint (the run stands without one)."""


def server_fingerprint(
    client: httpx.Client, *, shared: bool = False, budget_s: float = _BUDGET_S
) -> OutputFingerprint:
    """The fingerprint of the model a llama-server at `client`'s base URL serves; raises
    NoFingerprint with the reason where it cannot be taken (and httpx.HTTPError where the
    server stops answering). `shared`: others may send it requests, which would share its
    batches and move the logits: after each position it is asked whether any is in flight,
    and the fingerprint is given up if one is (a request that starts and ends within one
    position's is not seen)."""
    began = time.monotonic()
    n_vocab = _n_vocab(client)
    tokens = _tokens(client)
    slot = _slot_context(client)
    if slot is not None and slot < len(tokens):
        raise NoFingerprint(
            f"the server's slots hold {slot} tokens, fewer than the reference text's {len(tokens)}"
        )
    ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    rest: list[float] = []
    non_finite = 0
    # the last position predicts nothing the text holds: its distribution is not asked for
    for end in range(1, len(tokens)):
        if time.monotonic() - began > budget_s:
            raise NoFingerprint(f"{end - 1} positions took over {budget_s:.0f} s: given up")
        top = _top_at(client, tokens[:end])
        if shared and in_flight(client):
            raise NoFingerprint(
                "another client's requests were served while it was taken: not kept (they "
                "share the server's batches, which moves the logits)"
            )
        if any(lp is None for _, lp in top):
            non_finite += 1  # NaN or infinite logits: JSON has no number for them
        chosen = [
            min(max(lp, LEAST_LOGPROB), 0.0) if lp is not None else LEAST_LOGPROB for _, lp in top
        ]
        ids.append([token for token, _ in top])
        logprobs.append([round(lp, 5) for lp in chosen])
        rest.append(round(rest_of(chosen), 5))
    return OutputFingerprint(
        text_version=TEXT_VERSION,
        n_vocab=n_vocab,
        ids=ids,
        logprobs=logprobs,
        rest=rest,
        seconds=time.monotonic() - began,
        non_finite=non_finite,
    )


def _n_vocab(client: httpx.Client) -> int:
    """The model's vocabulary size, as /v1/models describes the model."""
    models = json_answer(client, "GET", "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    meta = first.get("meta") if isinstance(first, dict) else None
    n_vocab = meta.get("n_vocab") if isinstance(meta, dict) else None
    if not _is_count(n_vocab) or n_vocab == 0:
        raise NoFingerprint("the server does not give its model's vocabulary size")
    return int(n_vocab)


def _tokens(client: httpx.Client) -> list[int]:
    answer = json_answer(
        client, "POST", "/tokenize", json={"content": REFERENCE_TEXT, "add_special": True}
    )
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or len(tokens) < 2 or not all(map(_is_count, tokens)):
        raise NoFingerprint("the server did not tokenize the reference text")
    if len(tokens) - 1 > MOST_POSITIONS:
        raise NoFingerprint(f"the reference text is {len(tokens)} tokens to this model: too many")
    return tokens


def _slot_context(client: httpx.Client) -> int | None:
    """The tokens one slot holds, where the server says."""
    slots = json_answer(client, "GET", "/slots")
    sizes = (
        [s.get("n_ctx") for s in slots if isinstance(s, dict)] if isinstance(slots, list) else []
    )
    return min((n for n in sizes if _is_count(n)), default=None)


def _top_at(client: httpx.Client, prompt: list[int]) -> list[tuple[int, float | None]]:
    """The TOP_K likeliest tokens after `prompt` and their log-probabilities, likeliest
    first (None: not a number)."""
    body = {
        "prompt": prompt,  # token ids: the server adds no start token to them
        "n_predict": 1,
        "n_probs": TOP_K,
        "temperature": 0,
        "cache_prompt": True,
        "stream": False,
    }
    answer = json_answer(client, "POST", "/completion", json=body, timeout=_REQUEST_S)
    if answer is None:
        raise NoFingerprint(f"the server answered no completion after {len(prompt)} tokens")
    probabilities = answer.get("completion_probabilities") if isinstance(answer, dict) else None
    first = probabilities[0] if isinstance(probabilities, list) and probabilities else None
    top = first.get("top_logprobs") if isinstance(first, dict) else None
    if not isinstance(top, list) or not top:
        raise NoFingerprint(
            "the server gave no top_logprobs with token ids for a completion (llama-server "
            "builds before b4500 or so give probabilities by token text only)"
        )
    found: list[tuple[int, float | None]] = []
    for entry in top[:TOP_K]:
        token = entry.get("id") if isinstance(entry, dict) else None
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        if not _is_count(token):
            raise NoFingerprint(f"a top token without an id: {str(entry)[:100]}")
        number = isinstance(logprob, int | float) and not isinstance(logprob, bool)
        value = float(logprob) if number and logprob is not None else math.nan
        found.append((int(token), value if math.isfinite(value) else None))
    return found


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
