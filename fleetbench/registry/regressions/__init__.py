"""Regressions: did a node get slower, when, by how much, and what changed.

The pipeline, in the order a run goes through it:

- `queue`: ingest queues each (node, model) series it stored successful runs of, in the
  runs' own transaction (table series_checks, a projection of the runs:
  registry.projections.series_checks);
- `judge`: each registry process's judge takes the checks that are due, a burst of runs
  judged once, and for each
- `series`: reads the series (each PP x TG x B x metric of the node's model over its
  latest runs, with what each run ran on), also what `GET /v1/series` shows, and the
  outputs series (the runs' output fingerprints, per runner);
- the detector, pure functions over a series: `rules` (steps), `knee_shifts` (the knee's
  moves) and `output_shifts` (the outputs changing), comparing runs by what `labels`
  names;
- `store`: stores what the detector finds, lists and acknowledges regressions.
"""
