"""Placement: which node and concurrency meets X tokens/s per user for a model, and holds
each user's KV cache. In the order an answer is made:

- `offline_rows`: each node's offline choice from its latest curve, chosen and ranked in
  SQL (a thousand nodes answer in one query);
- `serving_rows`: the points of each node's latest serving run;
- `rules`: the decisions, pure functions over those rows (a node's choice,
  its fit, the answer's reason);
- `answer`: the steps that join them (fit caps per config, the choice read again under
  them, offline and serving candidates merged) into one PlacementAnswer.
"""
