"""The recent series of each (node, model), remembered between batches by the process that
stored them, so that the regression check at ingest does not read and assemble a pair's
history again for every report (that read was most of an ingest's work: README, "Holding a
fleet").

A node's entry is valid while the node's changes (node_activity.changes: raised by every
ingest of every process and by prune, never lowered) are what the entry was made at: a run
of the node that another process stored, or runs pruned, make them differ, and the history
is read from the database again. Entries are made only from committed transactions; at most
`size` nodes are kept, the least recently used dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetbench.registry.series import RecentSeries

__all__ = ["SeriesCache"]


@dataclass
class _NodeSeries:
    changes: int  # the node's changes its series were made at
    models: dict[int, RecentSeries] = field(default_factory=dict)


class SeriesCache:
    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self._nodes: OrderedDict[int, _NodeSeries] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self, node_id: int, model_id: int, *, changes: int, cells: frozenset[tuple[int, int]]
    ) -> RecentSeries | None:
        """The (node, model)'s series if they are what the database holds for a node at
        `changes`, and cover `cells`; else None."""
        with self._lock:
            entry = self._nodes.get(node_id)
            if entry is None or entry.changes != changes:
                return None
            self._nodes.move_to_end(node_id)
            recent = entry.models.get(model_id)
        return recent if recent is not None and cells <= recent.cells else None

    def committed(
        self,
        node_id: int,
        *,
        changes_before: int,
        changes_after: int,
        models: Mapping[int, RecentSeries],
    ) -> None:
        """A committed transaction took the node from `changes_before` to `changes_after`,
        leaving its models' series as `models`; its other models' series are unchanged (and
        kept, if they were valid before)."""
        with self._lock:
            entry = self._nodes.get(node_id)
            kept = entry.models if entry is not None and entry.changes == changes_before else {}
            self._nodes[node_id] = _NodeSeries(changes_after, {**kept, **models})
            self._nodes.move_to_end(node_id)
            while len(self._nodes) > self.size:
                self._nodes.popitem(last=False)
