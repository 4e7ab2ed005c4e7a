"""How many nodes serve N concurrent users, each at X tokens/s or more?

Each node offers the users its measured curve serves at the speed asked for (its
placement candidate: the largest concurrency meeting it, memory fit included). The fewest
nodes that together serve N are the ones offering the most: for any k nodes, the k largest
offers have the largest sum, so the smallest k whose largest offers reach N is the minimum,
and taking the largest first finds it. The same per hardware class says how many of that
class alone would do.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetbench.registry.prices.rules import usd_per_million_tokens

__all__ = ["NodeOffer", "Plan", "fewest_nodes", "most_users_first", "plans_per_class"]


@dataclass(frozen=True, slots=True)
class NodeOffer:
    """What one node serves at the speed asked for: `users` at once, `total_tps` in all, for
    its class's price per hour (None: the class has none)."""

    node: str
    hardware_class: str
    users: int
    total_tps: float
    usd_per_hour: float | None = None


@dataclass(frozen=True)
class Plan:
    nodes: tuple[NodeOffer, ...]  # the nodes used, most users first
    users: int  # asked for
    enough: bool  # whether the nodes used serve them all (else: every node offered)

    @property
    def users_served(self) -> int:
        return sum(n.users for n in self.nodes)

    @property
    def total_tps(self) -> float:
        return sum(n.total_tps for n in self.nodes)

    @property
    def headroom(self) -> int:
        """Users the plan's nodes could take beyond those asked for (< 0: short by)."""
        return self.users_served - self.users

    @property
    def usd_per_hour(self) -> float | None:
        """What the plan's nodes cost an hour (None: no node, or one without a price)."""
        prices = [n.usd_per_hour for n in self.nodes if n.usd_per_hour is not None]
        if not self.nodes or len(prices) < len(self.nodes):
            return None
        return math.fsum(prices)

    @property
    def usd_per_million_tokens(self) -> float | None:
        usd = self.usd_per_hour
        return None if usd is None else usd_per_million_tokens(usd, self.total_tps)


def most_users_first(offer: NodeOffer) -> tuple[int, float, str]:
    """The order plans list their nodes in, and break ties by: most users, then most
    tokens/s, then by name."""
    return (-offer.users, -offer.total_tps, offer.node)


def fewest_nodes(offers: Iterable[NodeOffer], users: int) -> Plan:
    """The fewest nodes serving `users`, each node used once; among plans of that size, the
    one serving most (ties: most tokens/s, then by name). Not enough nodes: all of them."""
    chosen: list[NodeOffer] = []
    served = 0
    for offer in sorted((o for o in offers if o.users > 0), key=most_users_first):
        if served >= users:
            break
        chosen.append(offer)
        served += offer.users
    return Plan(tuple(chosen), users, served >= users)


def plans_per_class(offers: Sequence[NodeOffer], users: int) -> dict[str, Plan]:
    """For each hardware class, the fewest of its nodes alone serving `users`."""
    by_class: dict[str, list[NodeOffer]] = defaultdict(list)
    for offer in offers:
        by_class[offer.hardware_class].append(offer)
    return {name: fewest_nodes(found, users) for name, found in sorted(by_class.items())}
