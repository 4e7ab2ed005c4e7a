"""What a model outputs on one fixed text, compact enough to send with every run: an offline
sweep's check that a build computes what the one before did (a faster kernel that is wrong
is the worst rollout there is). Part of the wire format (contract.wire re-exports it).

The agent runs the model once over REFERENCE_TEXT, outside the timed points, and keeps at
each position the TOP_K likeliest next tokens' log-probabilities and the rest of the
probability as one bucket. Two fingerprints of the same model file compare as llama.cpp's
`llama-perplexity --kl-divergence` compares logits: the KL divergence of the new
distribution from the base one at each position (here over the tokens both list and one
bucket for all others: coarser buckets never raise a KL divergence, so this is a lower bound
of the full one) and the share of positions whose top token agrees.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetbench.contract.bounds import Figure, Int32

__all__ = [
    "LEAST_LOGPROB",
    "MOST_POSITIONS",
    "REFERENCE_TEXT",
    "TEXT_VERSION",
    "TOP_K",
    "OutputDifference",
    "OutputFingerprint",
    "compare_outputs",
    "rest_of",
]

TEXT_VERSION = "fleetbench-text-1"
TOP_K = 8
MOST_POSITIONS = 2048
LEAST_LOGPROB = -1e4  # what a log-probability of nothing is sent as: log(0) is no number
# The text every node's model reads: prose, a list, numbers, code and another language, so
# that a kernel wrong only on some token kinds still shows. Changing it is a new version.
REFERENCE_TEXT = """\
The lighthouse keeper wrote in the log every evening at six: the wind, the swell, the ships
that passed, and anything else worth a line. On the fourteenth of March 1923 he wrote that a
schooner had anchored off the northern reef, that her crew had rowed ashore for water, and
that their captain had paid for it with three silver coins and a story about the ice.

A recipe for bread, as the keeper's wife kept it:
1. Mix 500 g of flour, 350 ml of warm water, 10 g of salt and 7 g of dried yeast.
2. Knead for ten minutes, then leave it covered for an hour, until it has doubled.
3. Shape it, leave it for another 45 minutes, and bake at 230 degrees for 35 minutes.

def mean_and_spread(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    spread = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return mean, spread

Le gardien notait aussi la température de l'eau: 8,5 degrés en mars, 17 en août. Die
Schiffe, die im Winter vorbeifuhren, waren seltener, aber größer. In 1961 the light was
automated, the keeper moved to the town, and the log, 38 volumes in all, went to a museum.
"""


LogProbability = Annotated[float, Field(le=0, ge=LEAST_LOGPROB, allow_inf_nan=False)]


def rest_of(logprobs: Iterable[float]) -> float:
    """The log of the probability that tokens of these log-probabilities leave to all the
    others (LEAST_LOGPROB where they leave none)."""
    left = 1.0 - math.fsum(math.exp(lp) for lp in logprobs)
    return max(math.log(left), LEAST_LOGPROB) if left > 0 else LEAST_LOGPROB


class OutputFingerprint(BaseModel):
    """A model's top TOP_K next-token log-probabilities at each position of the reference
    text (`ids[i]` and `logprobs[i]`, likeliest first) and the log of the probability left
    over (`rest[i]`); `n_vocab` sizes the rest. Measured outside the timed points."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    text_version: Annotated[str, Field(min_length=1, max_length=64)] = TEXT_VERSION
    n_vocab: Int32 = Field(gt=0, description="the model's vocabulary size")
    ids: list[list[Int32]] = Field(max_length=MOST_POSITIONS)
    logprobs: list[list[LogProbability]] = Field(max_length=MOST_POSITIONS)
    rest: list[LogProbability] = Field(
        max_length=MOST_POSITIONS,
        description="log of the probability beyond the top tokens (-1e4: none)",
    )
    seconds: Figure | None = Field(default=None, description="what taking it cost the sweep")
    non_finite: Int32 = Field(
        default=0,
        description="positions whose logits were not all finite numbers (NaN, inf): a broken "
        "kernel's mark (their other logits are kept)",
    )

    @model_validator(mode="after")
    def _positions_agree(self) -> OutputFingerprint:
        if not len(self.ids) == len(self.logprobs) == len(self.rest):
            raise ValueError("ids, logprobs and rest give different numbers of positions")
        for at, (ids, logprobs) in enumerate(zip(self.ids, self.logprobs, strict=True)):
            if not 0 < len(ids) == len(logprobs) <= 64:
                raise ValueError(f"position {at}: top tokens and their log-probabilities differ")
        return self


@dataclass(frozen=True)
class OutputDifference:
    """How far a new fingerprint's distributions lie from a base's."""

    positions: int
    mean_kl: float
    p99_kl: float
    top_token_agreement: float  # the share of positions whose likeliest token is the same

    def __str__(self) -> str:
        return (
            f"KL divergence mean {self.mean_kl:.4f}, p99 {self.p99_kl:.4f}; top token the same "
            f"at {self.top_token_agreement:.1%} of {self.positions} positions"
        )


_LEAST_MASS = 1e-12  # a bucket emptier than this is taken as this: log(0) is no number


def _kl_at(
    base: tuple[Sequence[int], Sequence[float]], new: tuple[Sequence[int], Sequence[float]]
) -> float:
    """KL(base || new) at one position over the tokens both list, each its own bucket, and
    one bucket for every other token: both sides' masses are exact there, and merging
    buckets never raises a KL divergence, so it is at most the full one."""
    base_lp = dict(zip(*base, strict=True))
    new_lp = dict(zip(*new, strict=True))
    kl, base_taken, new_taken = 0.0, 0.0, 0.0
    for token in base_lp.keys() & new_lp.keys():
        p, q = base_lp[token], new_lp[token]
        base_taken += math.exp(p)
        new_taken += math.exp(q)
        kl += math.exp(p) * (p - q)
    p_other = max(1.0 - base_taken, _LEAST_MASS)
    q_other = max(1.0 - new_taken, _LEAST_MASS)
    return max(kl + p_other * (math.log(p_other) - math.log(q_other)), 0.0)


def compare_outputs(base: OutputFingerprint, new: OutputFingerprint) -> OutputDifference | None:
    """The difference of `new` from `base`; None where they are of different texts, models
    (vocabularies) or lengths, which do not compare."""
    if (base.text_version, base.n_vocab, len(base.ids)) != (
        new.text_version,
        new.n_vocab,
        len(new.ids),
    ) or not base.ids:
        return None
    kls = sorted(
        _kl_at(b, n)
        for b, n in zip(
            zip(base.ids, base.logprobs, strict=True),
            zip(new.ids, new.logprobs, strict=True),
            strict=True,
        )
    )
    agree = sum(b[0] == n[0] for b, n in zip(base.ids, new.ids, strict=True))
    p99 = kls[min(len(kls) - 1, math.ceil(0.99 * len(kls)) - 1)]
    return OutputDifference(len(kls), sum(kls) / len(kls), p99, agree / len(kls))
