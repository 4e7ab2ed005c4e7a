"""What each series can see, and the curve's shape as a regression of its own: the minimum
detectable change of a series (regressions.rules) on literal series and through the API
and placement, and the knee moving at a new build (regressions.knee_shifts), on SQLite and
PostgreSQL."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Any

import pytest

from fleetbench.registry.regressions.knee_shifts import find_knee_shifts, knee_series
from fleetbench.registry.regressions.rules import (
    DetectionSettings,
    SeriesRun,
    detectable_change,
    min_detectable_change,
)
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    DAY0,
    LiveRegistry,
    make_report,
    post_report,
)

# The article's curve has its knee at B=8; with B=8 at 80 tokens/s (4 streams to 8 add 2.6
# per stream, under a quarter of one stream's 28.3) the knee is at 4.
KNEE_4 = [(b, s_pp, 80.0 if b == 8 else s_tg) for b, s_pp, s_tg in ARTICLE_TABLE]
WOBBLE = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.02, 0.98, 1.01, 0.99]  # 1.6% run to run


def _runs(values: list[float], builds: list[str]) -> list[SeriesRun]:
    return [
        SeriesRun(uuid.uuid4(), DAY0 + timedelta(days=i), v, build, None, "h", "")
        for i, (v, build) in enumerate(zip(values, builds, strict=True))
    ]


def test_the_detectable_change_grows_with_noise_and_shrinks_with_runs() -> None:
    s = DetectionSettings()
    # (2.75 + 1.645) standard errors of a difference of means of 5 and 3 runs at 3% noise
    assert detectable_change(0.03, 5, 3) == pytest.approx(4.395 * 0.03 * math.sqrt(1 / 5 + 1 / 3))
    assert detectable_change(0.001, 20, 5) == s.min_change  # never below what it reports
    assert detectable_change(0.03, 20, 5) < detectable_change(0.03, 5, 2)


def test_a_series_knows_its_own_noise_and_runs_per_build() -> None:
    steady = _runs([100 * w for w in WOBBLE], ["b1"] * 5 + ["b2"] * 5)
    noisy = _runs([100 * (1 + 4 * (w - 1)) for w in WOBBLE], ["b1"] * 5 + ["b2"] * 5)
    quiet, loud = min_detectable_change(steady), min_detectable_change(noisy)
    assert quiet is not None and loud is not None
    # Noise as the detector reads it from successive runs: 2.6% (the wobble alternates);
    # 4.4 standard errors of a difference of means of the 10 runs so far and the 5 a build
    # keeps: 6.3%, a 10% drop is seen
    assert quiet == pytest.approx(4.395 * 0.02629 * math.sqrt(1 / 10 + 1 / 5), rel=1e-3)
    assert loud == pytest.approx(4 * quiet, rel=0.02)  # about four times the noise: unseen
    assert min_detectable_change(steady[:2]) is None


def _curve_runs(tables: list[list[tuple[int, float, float]]], builds: list[str]) -> Any:
    """S_TG series keyed by B, of runs with these curves and builds."""
    ids = [uuid.uuid4() for _ in tables]
    return {
        b: [
            SeriesRun(ids[i], DAY0 + timedelta(days=i), {x: s for x, _, s in t}[b],
                      builds[i], None, "h", "")
            for i, t in enumerate(tables)
        ]
        for b, _, _ in ARTICLE_TABLE
    }  # fmt: skip


def test_the_knee_moving_at_a_new_build_is_a_step() -> None:
    by_b = _curve_runs([ARTICLE_TABLE] * 5 + [KNEE_4] * 2, ["b1"] * 5 + ["b2"] * 2)
    series = knee_series(by_b)
    assert [r.value for r in series] == [8.0] * 5 + [4.0] * 2
    [step] = find_knee_shifts(series)
    assert (step.before, step.after, step.change) == (8.0, 4.0, -0.5)
    assert step.first is series[5] and step.cause_kinds == ("llama.cpp build",)
    # one run after the change is not enough; runs after it that disagree are no move
    assert find_knee_shifts(series[:6]) == []
    flipping = knee_series(_curve_runs([ARTICLE_TABLE] * 5 + [KNEE_4, ARTICLE_TABLE],
                                       ["b1"] * 5 + ["b2"] * 2))  # fmt: skip
    assert find_knee_shifts(flipping) == []
    # no known change, no move: a knee that shifts on its own is the throughput series' to see
    assert find_knee_shifts(knee_series(_curve_runs([ARTICLE_TABLE] * 5 + [KNEE_4] * 2,
                                                    ["b1"] * 7))) == []  # fmt: skip


def test_the_registry_reports_a_knee_move_and_what_each_series_can_see(
    live_registry: LiveRegistry,
) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        for day, (table, build) in enumerate([(ARTICLE_TABLE, 11429)] * 5 + [(KNEE_4, 11500)] * 2):
            wobbled = [(b, p, s * WOBBLE[day]) for b, p, s in table]
            sent = make_report(table=wobbled, build_number=build,
                               started_at=DAY0 + timedelta(days=day))  # fmt: skip
            assert post_report(client, sent).status_code == 201
    with live_registry.client() as client:
        found = client.get("/v1/regressions", params={"node": "m4pro"}).json()["data"]
        series = client.get(
            "/v1/series",
            params={"node": "m4pro", "model": ARTICLE_MODEL, "pp": 512, "tg": 128, "b": 4},
        ).json()
        answer = client.get(
            "/v1/placement", params={"model": ARTICLE_MODEL, "min_tps_per_user": 15}
        ).json()
    [knee] = [r for r in found if r["metric"] == "knee"]
    assert (knee["pp"], knee["tg"], knee["b"]) == (512, 128, 0)
    assert (knee["before"], knee["after"], knee["change_pct"]) == (8.0, 4.0, -50.0)
    assert knee["cause"].startswith("llama.cpp build changed")
    assert knee["min_detectable_change_pct"] is None
    [b8] = [r for r in found if r["metric"] == "s_tg"]  # B=8 itself fell 40%
    assert b8["b"] == 8 and b8["min_detectable_change_pct"] >= 5.0
    # B=4 (17.4 tokens/s per user) is the candidate; its series sees steps of 5-10%
    [candidate] = answer["candidates"]
    assert candidate["concurrency"] == 4
    seen = series["min_detectable_change_pct"]
    assert 5.0 <= seen < 10.0 and candidate["min_detectable_change_pct"] == pytest.approx(
        seen, abs=0.01
    )
    assert "cannot show" not in answer["reason"]


def test_placement_says_which_candidates_cannot_show_a_10_percent_slowdown(
    live_registry: LiveRegistry,
) -> None:
    with live_registry.client(live_registry.token("noisy")) as client:
        for day, wobble in enumerate(WOBBLE):
            shaken = [(b, p, s * (1 + 4 * (wobble - 1))) for b, p, s in ARTICLE_TABLE]
            sent = make_report(node="noisy", table=shaken, started_at=DAY0 + timedelta(days=day))
            assert post_report(client, sent).status_code == 201
    with live_registry.client() as client:
        answer = client.get(
            "/v1/placement", params={"model": ARTICLE_MODEL, "min_tps_per_user": 15}
        ).json()
    [candidate] = answer["candidates"]
    assert candidate["min_detectable_change_pct"] > 10
    assert "the series of 1 listed node(s) cannot show a 10% slowdown (noisy: " in answer["reason"]
    assert "sweep with repeats = auto, or more often" in answer["reason"]
