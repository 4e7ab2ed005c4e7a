"""Capacity: how many of which nodes serve N concurrent users, each at X tokens/s or more.

- `answer`: placement's candidates (registry.placement) as each node's offer, and the
  nodes left out and why;
- `rules`: the plan, pure functions over the offers (the fewest nodes, each hardware
  class alone);
- `cheapest`: the cheapest nodes an hour, by each class's price (exact up to a work bound,
  greedy within a stated lower bound above it).
"""
