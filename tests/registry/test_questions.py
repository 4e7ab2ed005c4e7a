"""The registry's pure questions: steps in a series, the knee, hardware memory, KV fit."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from fleetbench.contract.wire import ModelInfo
from fleetbench.registry.curves.knee import find_knee
from fleetbench.registry.curves.rules import curve_figures
from fleetbench.registry.hardware import summarize_hardware
from fleetbench.registry.placement.rules import (
    NodeMemory,
    largest_fitting_concurrency,
    why_fit_unchecked,
)
from fleetbench.registry.regressions.rules import SeriesRun, describe_cause, find_steps
from tests.factories import ARTICLE_MODEL_INFO, ARTICLE_TABLE

GIB = 2**30
START = datetime(2026, 11, 1, tzinfo=UTC)


def series(*segments: tuple[str, list[float]], hardware: str = "M4 Pro") -> list[SeriesRun]:
    """Runs of (build, values) segments, one run per value, hourly."""
    runs = []
    for build, values in segments:
        for value in values:
            runs.append(
                SeriesRun(
                    run_id=uuid.uuid4(),
                    started_at=START + timedelta(hours=len(runs)),
                    value=value,
                    build=build,
                    binding=None,
                    hardware=hardware,
                    settings="n_batch=2048",
                )
            )
    return runs


def noisy(centre: float, n: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [centre * (1 + rng.gauss(0, spread)) for _ in range(n)]


def test_a_15_percent_drop_after_a_build_change_is_a_regression_caused_by_the_build() -> None:
    runs = series(("b11429", noisy(133.65, 6, 0.02, 1)), ("b11500", noisy(113.6, 2, 0.02, 2)))
    [step] = find_steps(runs)
    assert step.is_regression
    assert step.change == pytest.approx(-0.15, abs=0.03)
    assert step.cause_kinds == ("llama.cpp build",)
    assert step.first is runs[6]
    assert step.before_run is runs[5]
    assert (step.runs_before, step.runs_after) == (6, 2)
    assert step.confidence > 0.99


def test_one_run_after_the_upgrade_is_not_yet_enough() -> None:
    runs = series(("b11429", noisy(133.65, 6, 0.02, 1)), ("b11500", [113.6]))
    assert find_steps(runs) == []


@pytest.mark.parametrize("seed", range(20))
def test_noise_alone_raises_nothing_even_across_builds(seed: int) -> None:
    runs = series(
        ("b11429", noisy(100, 12, 0.03, seed)), ("b11500", noisy(100, 12, 0.03, seed + 100))
    )
    assert find_steps(runs) == []


def test_a_single_outlier_that_reverts_is_not_a_regression() -> None:
    assert find_steps(series(("b1", [100] * 8 + [80] + [100] * 5))) == []
    # even when it comes with an upgrade: the next run on the new build is back
    assert find_steps(series(("b1", [100] * 8), ("b2", [80, 100, 100]))) == []


def test_a_step_that_persisted_is_kept_after_a_later_build_recovers() -> None:
    runs = series(("b1", [100, 101, 99, 100, 100, 101]), ("b2", [85, 84, 86]), ("b3", [100] * 4))
    first, second = find_steps(runs)
    assert first.is_regression and first.cause_kinds == ("llama.cpp build",)
    assert first.first.build == "b2" and first.change == pytest.approx(-0.15, abs=0.01)
    assert not second.is_regression and second.first.build == "b3"


def test_a_step_nothing_explains_needs_three_runs_and_names_no_cause() -> None:
    before = [100, 101, 99, 100, 100, 101, 99, 100]
    assert find_steps(series(("b1", [*before, 85, 85]))) == []
    [step] = find_steps(series(("b1", [*before, 85, 85, 86])))
    assert step.cause_kinds == ()


def test_a_change_below_the_threshold_is_ignored_however_clear() -> None:
    assert find_steps(series(("b1", [100.0] * 8), ("b2", [97.0] * 4))) == []


def test_a_driver_change_is_named_as_the_cause() -> None:
    runs = series(("b1", [100.0] * 6)) + [
        SeriesRun(
            run_id=uuid.uuid4(),
            started_at=START + timedelta(days=2, hours=i),
            value=80.0,
            build="b1",
            binding=None,
            hardware="H100 (driver 555.42)",
            settings="n_batch=2048",
        )
        for i in range(2)
    ]
    [step] = find_steps(runs)
    assert step.cause_kinds == ("hardware",)


def test_knee_of_the_article_table_is_8() -> None:
    assert find_knee([(b, s_tg) for b, _, s_tg in ARTICLE_TABLE]) == 8


def test_knee_moves_with_the_threshold_and_handles_missing_b1() -> None:
    curve = [(b, s_tg) for b, _, s_tg in ARTICLE_TABLE]
    assert find_knee(curve, threshold=0.10) == 16  # 8 -> 16 adds 13% of S_TG(1)
    assert find_knee(curve, threshold=0.50) == 1  # 1 -> 2 adds 49%
    assert find_knee(curve[1:]) == 8
    assert find_knee([]) is None
    assert find_knee([*curve, (8, 100.0)]) == 8  # a B given twice counts with its best


def test_hardware_memory_budget_by_kind() -> None:
    apple = summarize_hardware(
        {"probes": {"apple": {"chip": "Apple M4 Pro", "memory_bytes": 24 * GIB}}}
    )
    assert apple.description == "Apple M4 Pro, 24 GiB"
    assert apple.memory_bytes == 18 * GIB and apple.memory_kind == "unified"
    gpus = {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * GIB}
    nvidia = summarize_hardware(
        {
            "probes": {
                "nvidia": {"driver_version": "550.54.15", "gpus": [gpus, gpus]},
                "host": {"cpu_model": "EPYC", "memory_bytes": 512 * GIB},
            }
        }
    )
    assert nvidia.description == "2x NVIDIA H100 80GB HBM3 (driver 550.54.15)"
    assert nvidia.memory_bytes == 160 * GIB and nvidia.memory_kind == "gpu"
    host = summarize_hardware({"probes": {"host": {"cpu_model": "EPYC", "memory_bytes": GIB}}})
    assert (host.memory_bytes, host.memory_kind) == (GIB, "host")
    assert summarize_hardware({}).memory_bytes is None


NEMO = ARTICLE_MODEL_INFO


def test_largest_fitting_concurrency_on_a_24_gib_m4_pro() -> None:
    memory = NodeMemory("m4pro", 18 * GIB, NEMO, None, None, None)
    assert why_fit_unchecked(memory) is None
    # (18 GiB - 6.96 GiB of weights) / 1.25 GiB per 8,000-token user (its share padded to
    # 8,192 cells, as llama.cpp b6975+ pads each sequence's) = 8.83
    assert largest_fitting_concurrency(memory, tokens_per_user=8_000) == 8
    assert largest_fitting_concurrency(memory, tokens_per_user=20_480) == 3
    assert largest_fitting_concurrency(memory, tokens_per_user=10_000_000) == 0


def test_fit_is_unchecked_without_the_numbers() -> None:
    bare = ModelInfo(name="x")
    assert "architecture" in (why_fit_unchecked(NodeMemory("n", GIB, bare, None, None, None)) or "")
    assert "memory" in (why_fit_unchecked(NodeMemory("n", None, NEMO, None, None, None)) or "")
    odd = NodeMemory("n", GIB, NEMO, "q3_weird", None, None)
    assert "q3_weird" in (why_fit_unchecked(odd) or "")


def test_a_build_reverted_soon_after_a_step_is_blamed_at_the_revert() -> None:
    runs = series(("b1", [100.0] * 10), ("b2", [120.0, 120.0]), ("b1", [100.0] * 10))
    up, down = find_steps(runs)
    assert up.first is runs[10] and up.change == pytest.approx(0.2)
    assert down.first is runs[12] and down.change == pytest.approx(-1 / 6)
    assert down.cause_kinds == ("llama.cpp build",)


def test_a_step_judged_before_is_a_segment_start_for_later_runs() -> None:
    runs = series(("b1", noisy(100, 30, 0.01, 5)), ("b2", noisy(80, 30, 0.01, 6)))
    [step] = find_steps(runs)
    assert step.first is runs[30]
    # Each ingest judges only the latest runs' candidates. With the stored step fixed as a
    # segment start, the runs before it never make a second, unexplained step behind it
    # (without known_steps, 31, 32, ... would each look like one).
    for end in range(36, 46):
        assert find_steps(runs[:end], judge_from=end - 5, known_steps=[30]) == []
        assert find_steps(runs[:end], judge_from=end - 5) != []


def _labelled(build: str, binding: str, hardware: str, settings: str) -> SeriesRun:
    return SeriesRun(
        uuid.uuid4(), datetime(2026, 11, 1, tzinfo=UTC), 1.0, build, binding, hardware, settings
    )


BEFORE = _labelled("b6400", "llama-cpp-python 0.3.16", "abc123", "ctx=2048")


@pytest.mark.parametrize(
    ("after", "kinds", "cause"),
    [
        (BEFORE, (), "nothing known changed (same build, binding, hardware and settings)"),
        (
            _labelled("b6527", "llama-cpp-python 0.3.16", "abc123", "ctx=2048"),
            ("llama.cpp build",),
            "llama.cpp build changed (b6400 -> b6527)",
        ),
        (
            _labelled("b6400", "llama-cpp-python 0.3.36", "def456", "ctx=2048"),
            ("binding", "hardware"),
            "binding changed (llama-cpp-python 0.3.16 -> llama-cpp-python 0.3.36); "
            "hardware or driver changed (abc123 -> def456)",
        ),
        (
            _labelled("b6400", "llama-cpp-python 0.3.16", "abc123", "ctx=4096"),
            ("settings",),
            "settings changed",
        ),
    ],
)
def test_the_cause_names_what_changed_between_two_runs(
    after: SeriesRun, kinds: tuple[str, ...], cause: str
) -> None:
    assert after.changes_from(BEFORE) == kinds
    assert describe_cause(after.changes_from(BEFORE), BEFORE, after) == cause


def test_a_curve_s_figures_per_user_per_token_and_past_the_knee() -> None:
    """The article's M4 Pro table (B, S_TG, S_PP): knee at 8; at B = 32 each user gets 6.05
    tokens/s and waits 165 ms per token."""
    points = [
        (1, 28.3, 250.0),
        (2, 42.1, 260.0),
        (4, 70.0, 270.0),
        (8, 133.7, 285.8),
        (16, 166.0, None),
        (32, 193.6, 290.0),
    ]
    knee, figures = curve_figures(points, 0.25)
    assert knee == 8
    assert [f.past_knee for f in figures] == [False, False, False, False, True, True]
    last = figures[-1]
    assert (last.b, last.total_tps, last.prefill_tps) == (32, 193.6, 290.0)
    assert last.per_user_tps == pytest.approx(6.05)
    assert last.ms_per_token == pytest.approx(1000 * 32 / 193.6)
    assert figures[4].prefill_tps is None
    _, [tiny] = curve_figures([(1, 1e-320, None)], 0.25)
    assert tiny.ms_per_token is None  # 1000 / 1e-320 overflows: no figure, never inf
    assert curve_figures([], 0.25) == (None, [])
