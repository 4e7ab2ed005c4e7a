"""The output fingerprint's comparison, by hand: KL divergence over the base's top tokens and a
bucket for the rest, the top-token agreement, and what does not compare."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from fleetbench.contract.outputs import (
    REFERENCE_TEXT,
    TEXT_VERSION,
    OutputFingerprint,
    compare_outputs,
)


def _fingerprint(*positions: dict[int, float], n_vocab: int = 1000) -> OutputFingerprint:
    """Each position's top tokens with their probabilities (likeliest first)."""
    ids, logprobs, rest = [], [], []
    for probabilities in positions:
        ordered = sorted(probabilities.items(), key=lambda item: -item[1])
        ids.append([token for token, _ in ordered])
        logprobs.append([math.log(p) for _, p in ordered])
        left = 1 - sum(probabilities.values())
        rest.append(math.log(left) if left > 0 else -1e4)
    return OutputFingerprint(n_vocab=n_vocab, ids=ids, logprobs=logprobs, rest=rest)


def test_the_same_outputs_differ_by_nothing() -> None:
    base = _fingerprint({1: 0.7, 2: 0.2}, {5: 0.5, 6: 0.4})
    same = compare_outputs(base, base)
    assert same is not None
    assert (same.positions, same.mean_kl, same.p99_kl, same.top_token_agreement) == (
        2,
        0.0,
        0.0,
        1.0,
    )


def test_kl_divergence_by_hand() -> None:
    base = _fingerprint({1: 0.7, 2: 0.2})  # rest 0.1
    new = _fingerprint({2: 0.6, 1: 0.3})  # rest 0.1; the top token changed
    by_hand = 0.7 * math.log(0.7 / 0.3) + 0.2 * math.log(0.2 / 0.6) + 0.1 * math.log(0.1 / 0.1)
    found = compare_outputs(base, new)
    assert found is not None
    assert found.mean_kl == pytest.approx(by_hand) and found.top_token_agreement == 0.0
    assert f"{by_hand:.4f}" in str(found)


def test_a_token_only_one_side_lists_joins_the_bucket_of_all_others() -> None:
    base = _fingerprint({1: 0.6, 2: 0.3})  # token 2 is not in the new list, 3 not in the base's
    new = _fingerprint({3: 0.6, 1: 0.3})
    # token 1 its own bucket; the others: 0.4 of the base, 0.7 of the new
    by_hand = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    found = compare_outputs(base, new)
    assert found is not None
    assert found.mean_kl == pytest.approx(by_hand) and found.top_token_agreement == 0.0
    # a 9th token trading places with the 8th by a hair moves the KL by a hair, not a nat
    eight = dict.fromkeys(range(1, 8), 0.1) | {8: 0.03}
    swapped = dict.fromkeys(range(1, 8), 0.1) | {9: 0.0301}
    near = compare_outputs(_fingerprint(eight), _fingerprint(swapped))
    assert near is not None and near.mean_kl < 1e-3


def test_the_99th_percentile_is_the_99th_of_a_hundred_positions() -> None:
    calm, changed = {1: 0.9}, {2: 0.9}  # rest 0.1 each
    one = compare_outputs(_fingerprint(calm), _fingerprint(changed))
    assert one is not None
    base = _fingerprint(*[calm] * 100)
    once = compare_outputs(base, _fingerprint(*[calm] * 99, changed))
    twice = compare_outputs(base, _fingerprint(*[calm] * 98, changed, changed))
    assert once is not None and twice is not None
    # one position in a hundred changed: the mean moves, the 99th percentile does not
    assert (once.p99_kl, once.top_token_agreement) == (0.0, 0.99)
    assert once.mean_kl == pytest.approx(one.mean_kl / 100)
    assert twice.p99_kl == pytest.approx(one.mean_kl)


def test_fingerprints_of_other_texts_models_or_lengths_do_not_compare() -> None:
    base = _fingerprint({1: 0.9}, {2: 0.9})
    other_text = base.model_copy(update={"text_version": "fleetbench-text-0"})
    other_vocab = base.model_copy(update={"n_vocab": 32000})
    shorter = _fingerprint({1: 0.9})
    assert [compare_outputs(base, o) for o in (other_text, other_vocab, shorter)] == [None] * 3


def test_a_fingerprint_refuses_positions_that_disagree() -> None:
    with pytest.raises(ValidationError, match="different numbers of positions"):
        OutputFingerprint(n_vocab=10, ids=[[1]], logprobs=[[-0.1]], rest=[])
    with pytest.raises(ValidationError, match="position 0"):
        OutputFingerprint(n_vocab=10, ids=[[1, 2]], logprobs=[[-0.1]], rest=[-2.0])
    with pytest.raises(ValidationError):  # a log-probability above 0 is no probability
        OutputFingerprint(n_vocab=10, ids=[[1]], logprobs=[[0.5]], rest=[-2.0])


def test_the_reference_text_is_versioned_and_mixed() -> None:
    assert TEXT_VERSION == "fleetbench-text-1"
    # prose, a numbered list, code and two other languages: a kernel wrong on one kind shows
    for part in ("lighthouse", "1. Mix 500 g", "def mean_and_spread", "température", "größer"):
        assert part in REFERENCE_TEXT
