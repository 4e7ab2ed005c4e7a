"""Curves: a node's batching curves of a model, one per engine build.

- `answer`: the latest successful run of each build read, and answered with its figures;
- `rules`: what a curve's points tell a user (per-user speed and wait, the prefill);
- `knee`: where a curve bends (also what placement, the latest curves and the knee's
  regressions read).
"""
