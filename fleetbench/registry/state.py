"""What a registry process keeps between requests, in one object made at startup
(main.create_app): each cache bounded, and none of it module-global, so two apps in one
process (as tests run them) share nothing. A command line that asks a question once keeps
nothing."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fleetbench.contract.answers import CompareAnswer
from fleetbench.registry.authentication import KnownTokens
from fleetbench.registry.ingest.rows import KnownRows

__all__ = ["Bounded", "ProcessState"]

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


class Bounded(Generic[Key, Value]):
    """Entries weighing at most `size` in all (each 1, unless `weigh` says), the least
    recently used dropped first; safe across threads."""

    def __init__(self, size: int, weigh: Callable[[Value], int] = lambda _: 1) -> None:
        self.size = size
        self._weigh = weigh
        self._held: OrderedDict[Key, tuple[Value, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: Key) -> Value | None:
        with self._lock:
            found = self._held.get(key)
            if found is None:
                return None
            self._held.move_to_end(key)
            return found[0]

    def put(self, key: Key, value: Value) -> None:
        weight = self._weigh(value)
        if weight > self.size:
            return  # (it would push out everything else)
        with self._lock:
            old = self._held.pop(key, None)
            self._weight += weight - (old[1] if old else 0)
            self._held[key] = (value, weight)
            while self._weight > self.size:
                _, (_, dropped) = self._held.popitem(last=False)
                self._weight -= dropped

    def __len__(self) -> int:
        return len(self._held)


# a run's hardware class, by run id: a run's hardware never changes
MOST_CLASSES_HELD = 100_000
# build comparisons, by question and the signature of the sums they read (registry.compare),
# weighed by the points they list (about 1 KB each: 40 answers of 100 nodes x 12 points)
MOST_COMPARED_POINTS_HELD = 50_000


def _listed_points(answer: CompareAnswer) -> int:
    return 1 + sum(len(node.points) for node in answer.nodes)


@dataclass
class ProcessState:
    """The process's caches: rows that never change once written (ingest's builds, models
    and facts; each run's hardware class), tokens found valid, and answers that stand as
    long as what they read is unchanged."""

    known_rows: KnownRows = field(default_factory=KnownRows)
    known_tokens: KnownTokens = field(default_factory=KnownTokens)
    hardware_classes: Bounded[uuid.UUID, str] = field(
        default_factory=lambda: Bounded(MOST_CLASSES_HELD)
    )
    compare_answers: Bounded[Hashable, CompareAnswer] = field(
        default_factory=lambda: Bounded(MOST_COMPARED_POINTS_HELD, _listed_points)
    )
