"""The cheapest nodes serving N concurrent users, each at X tokens/s or more.

Each node offers `users` for its class's price per hour; the cheapest set whose offers add
up to N is a min-cost covering knapsack, NP-hard in general, but exact in pseudo-polynomial
time: a dynamic programme over the users served so far, capped at N, one step per bundle of
identical offers (same price, same users: a class of 300 identical nodes is one offer taken
0..300 times, in bundles of 1, 2, 4, ... copies, 9 steps rather than 300). Its work is the
bundles times N + 1: up to EXACT_WORK (a million) it runs; above, a greedy plan does: the
cheapest price per user first until the users are served, then the dearest nodes no longer
needed dropped.

How far greedy can be from the cheapest: the fractional plan (the same order, the last node
taken in part) is the linear relaxation's optimum, so no plan costs less; greedy's nodes
before its last cost no more than the fractional plan's, so greedy costs at most that bound
plus its last node's price, a node it never drops (the plan is short without it). The answer
states the bound, and so how much a cheaper plan could save at most (0 when exact).

Prices are compared exactly: each float as an integer count of the smallest power-of-two
fraction among them, so that two plans of equal price tie (0.1 + 0.2 is no dearer than 0.3)
and the tie goes to fewer nodes, then more users served. Among identical offers the most
tokens/s, then the first by name, are taken.
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from fleetbench.registry.capacity.rules import NodeOffer, Plan, most_users_first

__all__ = ["EXACT_WORK", "CheapestPlan", "cheapest_nodes", "greedy_plan"]

# Dynamic-programme cells (bundles x (users + 1)) planned exactly, about a quarter of a
# second of CPython and 8 MB of back-pointers at most; a larger question is planned greedily.
EXACT_WORK = 1_000_000


@dataclass(frozen=True)
class CheapestPlan:
    plan: Plan  # not enough: every priced node
    exact: bool | None  # the cheapest there is (None: not enough priced nodes)
    # No plan serving the users costs less: the plan's own price when exact, else the
    # fractional plan's (None: not enough priced nodes)
    lower_bound_usd_per_hour: float | None

    @property
    def most_saved_usd_per_hour(self) -> float | None:
        """The most a cheaper plan could save an hour: 0 when exact."""
        usd, bound = self.plan.usd_per_hour, self.lower_bound_usd_per_hour
        return None if usd is None or bound is None else usd - bound


@dataclass(frozen=True)
class _Bundle:
    """`copies` of one group's identical offer, taken together by the dynamic programme."""

    group: int
    copies: int
    price_units: int
    users: int


def cheapest_nodes(offers: Iterable[NodeOffer], users: int) -> CheapestPlan:
    """The cheapest priced nodes serving `users`, each node used once: exact where the work
    is within EXACT_WORK, else greedy within its stated bound. Offers without a price (or
    without a user) are left out; not enough of the rest: all of them."""
    priced = [o for o in offers if o.usd_per_hour is not None and o.users > 0]
    if sum(o.users for o in priced) < users:
        return CheapestPlan(Plan(_listed(priced), users, False), None, None)
    groups = _identical(priced)
    bundles = _bundles(groups, users, _price_units(priced))
    if len(bundles) * (users + 1) > EXACT_WORK:
        return greedy_plan(priced, users)
    plan = Plan(_listed(_exact(groups, bundles, users)), users, True)
    return CheapestPlan(plan, True, plan.usd_per_hour)


def greedy_plan(priced: Sequence[NodeOffer], users: int) -> CheapestPlan:
    """The cheapest price per user first until `users` are served, then the dearest nodes
    no longer needed dropped; with the fractional plan's price as its lower bound. The
    offers must be priced and serve the users together."""
    units = _price_units(priced)
    by_price_per_user = sorted(
        priced, key=lambda o: (Fraction(units[_price(o)], o.users), *most_users_first(o))
    )
    taken: list[NodeOffer] = []
    served = 0
    for offer in by_price_per_user:
        if served >= users:
            break
        taken.append(offer)
        served += offer.users
    last = taken[-1]
    short_before_last = users - (served - last.users)
    lower_bound = math.fsum(
        [*(_price(o) for o in taken[:-1]), _price(last) * short_before_last / last.users]
    )
    for offer in sorted(taken, key=lambda o: (-units[_price(o)], o.users, o.node)):
        if served - offer.users >= users:
            taken.remove(offer)
            served -= offer.users
    return CheapestPlan(Plan(_listed(taken), users, True), False, lower_bound)


def _exact(
    groups: Sequence[Sequence[NodeOffer]], bundles: Sequence[_Bundle], users: int
) -> list[NodeOffer]:
    """The dynamic programme: best[s] is the least (price, nodes, -users) reaching s users
    served (s = `users`: that many or more) with the bundles so far; a bundle taken from s
    reaches min(s + its users, `users`). The bundles must serve the users together."""
    best: list[tuple[int, int, int] | None] = [None] * (users + 1)
    best[0] = (0, 0, 0)
    came_from: list[array[int]] = []  # per bundle: the state each state it improved came from
    for bundle in bundles:
        source = array("q", [-1]) * (users + 1)
        # downwards, so that each state is read before this bundle improves it; from
        # `users` itself no bundle improves anything (it costs more and serves no more)
        for served in range(users - 1, -1, -1):
            here = best[served]
            if here is None:
                continue
            reached = min(served + bundle.users, users)
            taken = (here[0] + bundle.price_units, here[1] + bundle.copies, here[2] - bundle.users)
            there = best[reached]
            if there is None or taken < there:
                best[reached] = taken
                source[reached] = served
        came_from.append(source)
    copies = [0] * len(groups)
    state = users
    for bundle, source in zip(reversed(bundles), reversed(came_from), strict=True):
        if source[state] >= 0:
            copies[bundle.group] += bundle.copies
            state = source[state]
    return [offer for group, n in zip(groups, copies, strict=True) for offer in group[:n]]


def _identical(priced: Iterable[NodeOffer]) -> list[list[NodeOffer]]:
    """The offers grouped by (price, users), each group in the order its nodes are taken."""
    groups: dict[tuple[float, int], list[NodeOffer]] = defaultdict(list)
    for offer in priced:
        groups[(_price(offer), offer.users)].append(offer)
    return [sorted(found, key=most_users_first) for _, found in sorted(groups.items())]


def _bundles(
    groups: Sequence[Sequence[NodeOffer]], users: int, units: dict[float, int]
) -> list[_Bundle]:
    """Each group as bundles of 1, 2, 4, ... copies and the rest, which add up to any count
    of the copies that could help (more than enough to serve the users alone never does)."""
    bundles: list[_Bundle] = []
    for index, group in enumerate(groups):
        offer = group[0]
        useful = min(len(group), -(-users // offer.users))
        size = 1
        while useful > 0:
            copies = min(size, useful)
            price = units[_price(offer)] * copies
            bundles.append(_Bundle(index, copies, price, offer.users * copies))
            useful -= copies
            size *= 2
    return bundles


def _price_units(priced: Iterable[NodeOffer]) -> dict[float, int]:
    """Each price as an integer count of the smallest power-of-two fraction any has: sums
    of these are exact."""
    ratios = {p: p.as_integer_ratio() for p in {_price(o) for o in priced}}
    scale = max((denominator for _, denominator in ratios.values()), default=1)
    return {p: numerator * (scale // denominator) for p, (numerator, denominator) in ratios.items()}


def _price(offer: NodeOffer) -> float:
    assert offer.usd_per_hour is not None  # (only priced offers are planned)
    return offer.usd_per_hour


def _listed(offers: Iterable[NodeOffer]) -> tuple[NodeOffer, ...]:
    return tuple(sorted(offers, key=most_users_first))
