"""The sweep plan and its points (agent/runners/__init__.py), pure functions checked on
literal tables: the grid, the cells each point needs, which points fit in memory, the
figures of a point from its repeats, and the settings a sweep asks for."""

from __future__ import annotations

import statistics

import pytest

from fleetbench.agent.runners import SweepSpec, needed_cells, plan_grid, point_from_samples
from fleetbench.contract.wire import ModelInfo, RunSettings

# 2 layers x 2 KV heads x (64 + 64) values x 2 bytes (f16): 1,024 bytes per cell
TINY = ModelInfo(name="tiny", n_layer=2, n_head_kv=2, head_dim_k=64, head_dim_v=64, file_size=0)


@pytest.mark.parametrize(
    ("pp", "tg", "b", "kv_unified", "pp_shared", "cells"),
    [
        (128, 32, 1, False, False, 8 * 160),  # each of max(B)=8 sequences gets 160
        (128, 32, 8, False, False, 8 * 160),
        (128, 32, 1, True, False, 160),  # unified: what this point's B sequences use
        (128, 32, 4, True, False, 4 * 160),
        (128, 32, 4, True, True, 128 + 4 * 32),  # one shared prompt, then 4 x TG
        (0, 128, 8, True, False, 8 * 128),
    ],
)
def test_cells_a_point_needs(
    pp: int, tg: int, b: int, kv_unified: bool, pp_shared: bool, cells: int
) -> None:
    spec = SweepSpec(npl=(1, 2, 4, 8), kv_unified=kv_unified, pp_shared=pp_shared)
    assert needed_cells(pp, tg, b, spec) == cells


def test_the_grid_is_pp_then_tg_then_b_and_the_context_fits_every_point() -> None:
    spec = SweepSpec(npp=(128, 512), ntg=(32,), npl=(1, 4))
    assert spec.grid() == [(128, 32, 1), (128, 32, 4), (512, 32, 1), (512, 32, 4)]
    assert spec.context_size() == 4 * (512 + 32)
    assert SweepSpec(npp=(128,), ntg=(32,), npl=(1, 4), n_ctx=100).context_size() == 100


@pytest.mark.parametrize(
    ("free_bytes", "runnable", "n_ctx"),
    [
        (None, [1, 2, 4, 8], 8 * 160),  # nothing known: every point runs
        (8 * 160 * 1024, [1, 2, 4, 8], 8 * 160),  # exactly enough for the largest
        # the context shrinks to what is run (640 cells, which llama.cpp pads to 768)
        (768 * 1024, [1, 2, 4], 4 * 160),
        (160 * 1024 - 1, [], 8 * 160),  # not even one sequence: the whole grid's size
    ],
)
def test_points_whose_kv_cache_does_not_fit_are_skipped_with_the_reason(
    free_bytes: int | None, runnable: list[int], n_ctx: int
) -> None:
    spec = SweepSpec(npp=(128,), ntg=(32,), npl=(1, 2, 4, 8), kv_unified=True)
    grid, skipped, size = plan_grid(spec, TINY, free_bytes)
    assert [b for _, _, b in grid] == runnable
    assert [f.b for f in skipped] == [b for b in (1, 2, 4, 8) if b not in runnable]
    assert all(f.reason.startswith("skipped: its KV cache for") for f in skipped)
    assert size == n_ctx


def test_a_point_from_its_repeats_is_the_median_time_with_the_spread() -> None:
    # (T_PP, T_TG) of three repeats of PP=128, TG=32, B=2, separate prompts
    samples = [(0.20, 0.50), (0.25, 0.40), (0.16, 0.64)]
    point = point_from_samples(128, 32, 2, 320, samples, shared=False)
    assert (point.t_pp, point.t_tg) == (0.20, 0.50)
    assert point.s_pp == pytest.approx(256 / 0.20)  # 2 prompts of 128
    assert point.s_tg == pytest.approx(64 / 0.50)
    assert point.t == pytest.approx(0.70) and point.s == pytest.approx(320 / 0.70)
    assert point.repeats == 3
    assert point.s_tg_stdev == pytest.approx(statistics.stdev([64 / 0.5, 64 / 0.4, 64 / 0.64]))
    assert point.s_pp_stdev == pytest.approx(statistics.stdev([256 / t for t, _ in samples]))
    shared = point_from_samples(128, 32, 2, 192, samples, shared=True)
    assert shared.s_pp == pytest.approx(128 / 0.20)  # one shared prompt
    single = point_from_samples(128, 32, 1, 160, [(0.1, 0.4)], shared=False)
    assert (single.repeats, single.s_pp_stdev, single.s_tg_stdev) == (1, None, None)


def test_the_settings_a_sweep_asks_for() -> None:
    spec = SweepSpec(n_batch=256, n_ubatch=128, flash_attn="on", n_threads=6, cache_type_v="q8_0")
    assert spec.run_settings() == RunSettings(
        n_ctx=None,
        n_batch=256,
        n_ubatch=128,
        flash_attn="on",
        kv_unified=False,
        pp_shared=False,
        tg_separate=False,
        n_gpu_layers=-1,
        n_threads=6,
        n_threads_batch=6,
        cache_type_k="f16",
        cache_type_v="q8_0",
    )
