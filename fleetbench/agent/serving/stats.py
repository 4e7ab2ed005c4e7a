"""A serving point (contract.wire.ServingPoint, as reports carry it) from the records of its
requests: pure functions, no clock, no I/O."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetbench.contract.bounds import storable_text
from fleetbench.contract.wire import ServingPoint

__all__ = ["RequestRecord", "describe_errors", "percentile", "serving_point"]


@dataclass
class RequestRecord:
    """One request as the client saw it: when it was sent, when each token arrived (seconds
    on one monotonic clock; the tokens of one event share its time, or are spread since the
    one before: load._arrived), when the stream ended, and what went wrong, if anything
    (None: it completed with the tokens asked for)."""

    sent: float
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    done: float | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_times)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _spread(
    name: str, values: Sequence[float], qs: Sequence[int], scale: float = 1.0
) -> dict[str, float | None]:
    return {
        f"{name}_p{q}": (value * scale if (value := percentile(values, q)) is not None else None)
        for q in qs
    }


def describe_errors(errors: dict[str, int]) -> str:
    """`3 http 503, 1 timeout`."""
    return ", ".join(f"{count} {kind}" for kind, count in errors.items())


def _error_kinds(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Failed requests by kind, as reports take them: storable names, at most 32 kinds (the
    rarest past 31 as `other`)."""
    kept: dict[str, int] = {}
    counted = Counter(r.error for r in records if r.error is not None)
    for kind, count in counted.most_common():
        name = storable_text(kind, 200) if len(kept) < 31 else "other"
        kept[name] = kept.get(name, 0) + count
    return kept


def serving_point(
    concurrency: int, records: Sequence[RequestRecord], *, started: float, ended: float
) -> ServingPoint:
    """The point of one concurrency. Per-user decode speed is a request's tokens after the
    first event over the time from its first to its last token; TTFT is from sending to the
    first token; inter-token latency is every gap between a request's tokens. Latencies are
    those of the completed requests: the failed ones are counted in `errors`."""
    completed = [r for r in records if r.error is None and r.token_times]
    speeds: list[float] = []
    ttfts: list[float] = []
    gaps: list[float] = []
    e2es: list[float] = []
    for record in completed:
        times = record.token_times
        first, last = times[0], times[-1]
        ttfts.append(first - record.sent)
        e2es.append((record.done or last) - record.sent)
        if last > first:
            speeds.append((len(times) - times.count(first)) / (last - first))
        gaps.extend(b - a for a, b in itertools.pairwise(times))
    seconds = ended - started
    output = sum(r.tokens for r in records)
    return ServingPoint.model_validate(
        {
            "concurrency": concurrency,
            "requests": len(records),
            "completed": len(completed),
            "output_tokens": output,
            "seconds": seconds,
            "total_tps": output / seconds if seconds > 0 else None,
            **_spread("per_user_tps", speeds, (10, 50, 90)),
            **_spread("ttft_ms", ttfts, (50, 90, 99), 1000),
            **_spread("itl_ms", gaps, (50, 90, 99), 1000),
            **_spread("e2e_ms", e2es, (50, 90, 99), 1000),
            "errors": _error_kinds(records),
        }
    )
