"""The projections of the runs: every table derived from the runs alone, in one list.

Ingest adds each batch of runs to each of them in the batch's transaction, in this order;
the prune keeps the runs they point at and takes the runs it deletes out of each;
`fleetbench-registry rebuild` makes those that hold state again from the runs
(registry.projections.rebuild). A question that needs a table of its own derived from the
runs adds one entry here, and a test holds each equal to its rebuild after any sequence of
reports and prunes.

- `activity`: each node's newest offline run and run count (node_activity). First: ingest
  locks a node's row here before it touches the node's other projections, and the prune
  and a rebuild take the same locks first.
- `latest`, `latest_serving`: each node's latest curve of each model (latest_runs,
  latest_points) and latest serving run (latest_serving_runs): placement, /metrics.
- `sums`: each node's runs of a model with one build summed per point (build_point_sums,
  build_sums_stamps): the build comparison.
- `queue`: the regression judge's queue of series to judge (series_checks): work to do,
  not state, with no rebuild.
"""

from fleetbench.registry.projections.activity import ACTIVITY
from fleetbench.registry.projections.base import Projection, StoredRun
from fleetbench.registry.projections.build_sums import BUILD_SUMS
from fleetbench.registry.projections.latest import LATEST, LATEST_SERVING
from fleetbench.registry.projections.series_checks import SERIES_CHECKS

__all__ = ["PROJECTIONS", "REBUILT", "Projection", "StoredRun", "rebuilt_named"]

PROJECTIONS: tuple[Projection, ...] = (ACTIVITY, LATEST, LATEST_SERVING, BUILD_SUMS, SERIES_CHECKS)
# those a rebuild makes again
REBUILT = tuple(p for p in PROJECTIONS if p.rebuild is not None)


def rebuilt_named(name: str) -> Projection:
    """The projection of that name that a rebuild makes (KeyError naming those there are)."""
    for projection in REBUILT:
        if projection.name == name:
            return projection
    known = ", ".join(p.name for p in REBUILT)
    raise KeyError(f"no projection named {name!r} to rebuild: there are {known}")
