"""The sums a build comparison reads (registry.projections.build_sums), kept by ingest and
the prune, and the answers each registry process keeps while they are unchanged
(registry.compare.answer): on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, true

from fleetbench.contract import wire
from fleetbench.registry.db import session_factory
from fleetbench.registry.models import BuildPointSum
from fleetbench.registry.projections.build_sums import SUM_COLUMNS, SUMS_KEY, sums_of_runs
from fleetbench.registry.regressions.labels import run_labels
from fleetbench.registry.retention import prune_runs
from tests.factories import DAY0, LiveRegistry, make_report, post_report
from tests.registry.test_compare import (
    FLEET,
    H100,
    NEW,
    OLD,
    compare,
    gpu,
    h100_slower_at_8_and_up,
    seed,
)


def by_key(rows: Iterable[Any]) -> dict[Any, Any]:
    return {
        tuple(getattr(r, k) for k in SUMS_KEY): tuple(getattr(r, s) for s in SUM_COLUMNS)
        for r in rows
    }


def kept_and_recounted(engine: Engine) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The kept sums, and the same counted again from the runs."""
    with session_factory(engine)() as session:
        kept = by_key(session.scalars(select(BuildPointSum)))
        kinds = ("offline", "serving")
        recounted = by_key(r for k in kinds for r in session.execute(sums_of_runs(k, true())))
    return kept, recounted


def assert_same(kept: dict[Any, Any], recounted: dict[Any, Any]) -> None:
    assert kept.keys() == recounted.keys()
    for key, sums in recounted.items():
        assert kept[key] == pytest.approx(sums, rel=1e-9), key


def post_runs(
    registry: LiveRegistry,
    node: str,
    *,
    runs: int,
    points: Mapping[int, list[wire.Point]] | None = None,
    **report: Any,
) -> None:
    """`runs` runs of each build on `node`, an hour apart (OLD's first), made by make_report
    with `report`'s fields and, if given, each build's `points`."""
    token = registry.token(node)
    with registry.client(token) as client:
        for build in (OLD, NEW):
            for run in range(runs):
                fields = report | ({"points": points[build]} if points else {})
                made = make_report(
                    node=node,
                    build_number=build,
                    started_at=DAY0 + timedelta(hours=build - OLD + run),
                    **fields,
                )
                assert post_report(client, made).status_code == 201


def test_the_kept_sums_are_the_runs_own_after_ingest_and_after_a_prune(
    live_registry: LiveRegistry,
) -> None:
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 3}, h100_slower_at_8_and_up)
    kept, recounted = kept_and_recounted(live_registry.engine)
    assert len(kept) == 6 * 2 * 2 * 6  # nodes x builds x metrics x B
    assert {s[0] for s in kept.values()} == {3}
    assert_same(kept, recounted)
    before = compare(live_registry)
    # the same question over the runs themselves (max_age_days reads them, not the sums)
    recent = compare(live_registry, max_age_days=36500)
    assert recent["verdict"] == before["verdict"] == "hold"

    def ratios(answer: dict[str, Any]) -> list[tuple[str, str, int]]:
        return [
            (c["hardware_class"], p["metric"], p["b"])
            for c in answer["classes"]
            for p in c["points"]
        ]

    def medians(answer: dict[str, Any]) -> list[float]:
        return [p["median_ratio"] for c in answer["classes"] for p in c["points"]]

    assert ratios(recent) == ratios(before) and len(ratios(before)) == 2 * 12
    assert medians(recent) == pytest.approx(medians(before), rel=1e-9)
    # the first runs of each node (hours 1-2: OLD's) are pruned; their sums go with them
    pruned = prune_runs(session_factory(live_registry.engine), cutoff=DAY0 + timedelta(hours=2.5))
    assert pruned.runs == 6 * 2
    kept, recounted = kept_and_recounted(live_registry.engine)
    assert {(k[1], s[0]) for k, s in kept.items()} == {
        (k[1], 3 - (k[1] == min(x[1] for x in kept)) * 2) for k in kept
    }
    assert_same(kept, recounted)
    after = compare(live_registry)
    assert {p["runs_from"] for n in after["nodes"] for p in n["points"]} == {1}


def test_a_comparison_asked_again_sees_the_runs_stored_since(live_registry: LiveRegistry) -> None:
    """The registry keeps each answer between questions; runs stored meanwhile (by
    another process: here the test's own engine) are in the next answer."""
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 1}, h100_slower_at_8_and_up)
    assert compare(live_registry)["verdict"] == "unknown"
    seed(live_registry.engine, FLEET, {NEW: 2}, h100_slower_at_8_and_up, first_hour=10, seed=8)
    answer = compare(live_registry)
    assert answer["verdict"] == "hold", answer["reason"]
    assert answer["reason"].startswith(f"{H100}: S_") and "(median of 3 nodes" in answer["reason"]
    assert {p["runs_to"] for n in answer["nodes"] for p in n["points"]} == {3}


def test_a_comparison_asked_again_after_a_prune_counts_only_the_runs_left(
    live_registry: LiveRegistry,
) -> None:
    seed(live_registry.engine, FLEET, {OLD: 3, NEW: 3}, h100_slower_at_8_and_up)
    before = compare(live_registry)
    assert before == compare(live_registry)  # (kept: the same answer)
    assert {p["runs_from"] for n in before["nodes"] for p in n["points"]} == {3}
    # runs start an hour apart from DAY0 + 1 h: the first two of the old build go
    pruned = prune_runs(
        session_factory(live_registry.engine), cutoff=DAY0 + timedelta(hours=2, minutes=30)
    )
    assert pruned.runs == 2 * len(FLEET)
    after = compare(live_registry)
    assert {p["runs_from"] for n in after["nodes"] for p in n["points"]} == {1}
    assert after["verdict"] == "unknown", after["reason"]


def test_the_repeats_spread_counts_when_runs_agree_too_well(live_registry: LiveRegistry) -> None:
    """Runs of both builds with the same speeds, each point measured 5 times with a 4%
    spread: the comparison's noise is the repeats' (detectable change wider), not the
    runs' agreement (which is none)."""
    for model, stdev in (("calm", None), ("noisy", 0.04)):
        points = [
            wire.Point(
                pp=512,
                tg=128,
                b=b,
                s_pp=1000.0,
                s_tg=30.0 * b,
                repeats=5,
                s_tg_stdev=None if stdev is None else stdev * 30.0 * b,
            )
            for b in (1, 8)
        ]
        post_runs(
            live_registry,
            "gpu-r",
            runs=3,
            model=model,
            points={OLD: points, NEW: points},
            hardware=gpu(H100, "gpu-r"),
        )
    detectable = {}
    for model in ("calm", "noisy"):
        [node] = compare(live_registry, model=model)["nodes"]
        detectable[model] = {p["detectable_pct"] for p in node["points"] if p["metric"] == "s_tg"}
    assert max(detectable["calm"]) < min(detectable["noisy"])


def test_speeds_at_the_bounds_are_stored_and_compared_as_numbers(
    live_registry: LiveRegistry,
) -> None:
    """1e12 tokens/s on one build, 1e-300 on the next, repeats' spreads of 5e-324: every
    run is stored (no underflow refused), and the comparison answers with numbers."""
    points = {
        build: [
            wire.Point(
                pp=512,
                tg=128,
                b=b,
                s_pp=speed,
                s_tg=speed,
                repeats=3,
                s_tg_stdev=5e-324,
                s_pp_stdev=speed,
            )
            for b in (1, 2)
        ]
        for build, speed in ((OLD, 1e12), (NEW, 1e-300))
    }
    post_runs(live_registry, "gpu-x", runs=2, points=points)
    answer = compare(live_registry)
    assert answer["nodes_compared"] == 0  # a ratio of 1e-312 is no measurement
    assert [n["node"] for n in answer["not_compared"]] == ["gpu-x"]
    assert answer["verdict"] == "unknown"


def test_a_prune_leaves_the_other_runs_sums_exact_beside_a_huge_one(
    live_registry: LiveRegistry,
) -> None:
    """A first run at 1e12 tokens/s, then three ordinary ones: once the first is pruned,
    the sums are the three's (counted again, not subtracted: 1e24 + 1e4 - 1e24 is 0)."""
    token = live_registry.token("gpu-p")
    with live_registry.client(token) as client:
        for hour, s_tg in ((1, 1e12), (5, 100.0), (6, 104.0), (7, 96.0)):
            report = make_report(
                node="gpu-p", table=[(1, 1000.0, s_tg)], started_at=DAY0 + timedelta(hours=hour)
            )
            assert post_report(client, report).status_code == 201
    pruned = prune_runs(session_factory(live_registry.engine), cutoff=DAY0 + timedelta(hours=2))
    assert pruned.runs == 1
    kept, recounted = kept_and_recounted(live_registry.engine)
    assert_same(kept, recounted)
    [s_tg] = [sums for key, sums in kept.items() if key[5] == "s_tg"]
    assert s_tg[:3] == pytest.approx((3, 300.0, 100.0**2 + 104.0**2 + 96.0**2))


def test_one_name_for_two_model_files_counts_each_node_once_recent_or_not(
    live_registry: LiveRegistry,
) -> None:
    """Two files under one name (two digests) on the same nodes: each node is compared
    once, whether the sums kept or the recent runs are read (`max_age_days`)."""
    for digest in ("a" * 64, "b" * 64):
        model = wire.ModelInfo(name="llama-8b", sha256=digest)
        post_runs(live_registry, "gpu-m", runs=2, model=model, hardware=gpu(H100, "gpu-m"))
    kept = compare(live_registry, model="llama-8b")
    recent = compare(live_registry, model="llama-8b", max_age_days=36500)
    for answer in (kept, recent):
        assert answer["nodes_compared"] == 1
        assert {p["runs_from"] for n in answer["nodes"] for p in n["points"]} == {4}


def test_flags_read_as_regression_causes_spell_them(live_registry: LiveRegistry) -> None:
    """A series run with kv_unified on: the comparison names its settings as
    registry.regressions.labels does (`kv_unified=True`), and the sums kept spell them so."""
    settings = wire.RunSettings(n_ctx=4096, kv_unified=True, swa_full=False)
    post_runs(live_registry, "gpu-f", runs=2, settings=settings, hardware=gpu(H100, "gpu-f"))
    expected = "n_ctx=4096 kv_unified=True swa_full=False"
    assert expected == run_labels(make_report().engine, None, None, settings).settings

    [node] = compare(live_registry)["nodes"]
    assert node["settings"].startswith(f"{expected} on ")
    with session_factory(live_registry.engine)() as session:
        assert set(session.scalars(select(BuildPointSum.settings))) == {expected}
    assert_same(*kept_and_recounted(live_registry.engine))
