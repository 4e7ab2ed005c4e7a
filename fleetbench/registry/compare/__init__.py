"""Build comparison and rollout verdicts: `GET /v1/compare`, `fleetbench-registry compare`."""

from fleetbench.registry.compare.answer import CompareAnswer, CompareKind, compare_builds

__all__ = ["CompareAnswer", "CompareKind", "compare_builds"]
