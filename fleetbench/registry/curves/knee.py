"""Where does a batching curve's knee lie?

Adding a stream costs every user latency; it is worth it while the stream adds a good share
of what a lone stream decodes. The knee is the largest concurrency B reached before the
marginal gain in total decode throughput per added stream,
(S_TG(B') - S_TG(B)) / (B' - B), falls below `threshold` x S_TG(1).

Default threshold 0.25: past the knee, each added user brings less than a quarter of a lone
user's speed while slowing all the others. On the article's M4 Pro table the gains per added
stream are 49%, 49%, 57% of S_TG(1) up to B=8, then 13% and 7%: the knee is 8 for any
threshold above 13.0% and up to 48.6%, so the default sits well inside that band.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

__all__ = ["KNEE_THRESHOLD", "find_knee"]

KNEE_THRESHOLD = 0.25


def find_knee(curve: Sequence[tuple[int, float]], threshold: float = KNEE_THRESHOLD) -> int | None:
    """The knee of a curve of (B, S_TG) points (any order; a B given twice counts with its
    best S_TG), or None for an empty curve. Without a B=1 point, the smallest B's per-user
    speed stands in for S_TG(1)."""
    best: dict[int, float] = {}
    for b, s in curve:
        best[b] = max(s, best.get(b, s))
    points = sorted(best.items())
    if not points:
        return None
    smallest_b, smallest_s = points[0]
    single_stream = smallest_s / smallest_b
    knee = smallest_b
    for (b, s), (next_b, next_s) in itertools.pairwise(points):
        if (next_s - s) / (next_b - b) < threshold * single_stream:
            break
        knee = next_b
    return knee
