"""Build comparison and rollout verdicts: `GET /v1/compare`, `fleetbench-agent compare`.

- `rows`: the builds a comparison names and their sums read (one key range per build);
- `pairs`: the arithmetic over the sums, with numpy;
- `rules`: the statistics and the verdict, pure functions;
- `outputs`: what the model outputs under each build, judged by `output_rules`' bars;
- `answer`: the comparison, kept per process while the sums it read are unchanged;
- `rollouts`: the watched comparisons, whose changes of verdict the webhook announces.
"""
