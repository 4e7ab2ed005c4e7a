"""The MBU maths (contract.bandwidth): bytes per decode step, MBU per point, the limit, and
which bandwidth a run is held against."""

from __future__ import annotations

import pytest

from fleetbench.contract.bandwidth import (
    LIMIT,
    decode_depth,
    decode_step_bytes,
    node_bandwidth,
    point_limit,
)
from fleetbench.contract.device_bandwidth import published_name
from fleetbench.contract.kv_cache import kv_bytes_read
from fleetbench.contract.wire import HardwareData, MemoryBandwidth, ModelInfo, RunSettings

# A dense model of 4 layers, 2 KV heads of 64: 4 x 2 x 64 x (K + V) x 2 bytes = 2 KiB a cell
DENSE = ModelInfo(
    name="dense",
    weight_bytes=1_000_000_000,
    n_layer=4,
    n_head_kv=2,
    head_dim_k=64,
    head_dim_v=64,
)
CELL = 4 * 2 * 64 * 2 * 2


def _peak(gb_per_s: float, source: str = "table") -> MemoryBandwidth:
    return MemoryBandwidth(bytes_per_s=gb_per_s * 1e9, source=source)


def test_a_dense_step_reads_the_weights_once_and_each_sequences_cache() -> None:
    assert kv_bytes_read(DENSE, 100) == 100 * CELL
    # PP 99, TG 1: each sequence attends to 100 cells
    assert decode_step_bytes(DENSE, b=1, pp=99, tg=1) == 1e9 + 100 * CELL
    assert decode_step_bytes(DENSE, b=8, pp=99, tg=1) == 1e9 + 8 * 100 * CELL
    q8 = RunSettings(cache_type_k="q8_0", cache_type_v="q8_0")
    assert decode_step_bytes(DENSE, b=1, pp=99, tg=1, settings=q8) == pytest.approx(
        1e9 + 100 * CELL * (34 / 32) / 2
    )


def test_a_prompt_shared_in_a_unified_cache_is_read_once() -> None:
    shared = RunSettings(pp_shared=True, kv_unified=True)
    # 8 sequences: the 99 prompt cells once, each sequence's own cell
    assert decode_step_bytes(DENSE, b=8, pp=99, tg=1, settings=shared) == 1e9 + (99 + 8) * CELL
    streams = RunSettings(pp_shared=True, kv_unified=False)  # the prompt copied per stream
    assert decode_step_bytes(DENSE, b=8, pp=99, tg=1, settings=streams) == 1e9 + 800 * CELL


def test_a_sliding_window_layer_reads_its_window_at_most() -> None:
    swa = DENSE.model_copy(update={"sliding_window": 10, "n_swa_layers": 2})
    # two full layers read 100 cells, two window layers 10
    assert kv_bytes_read(swa, 100) == (2 * 100 + 2 * 10) * CELL // 4


def test_experts_read_are_the_share_b_tokens_pick() -> None:
    moe = DENSE.model_copy(
        update={"expert_bytes": 8_000_000_000, "expert_count": 8, "expert_used_count": 2}
    )
    kv = 0.5 * CELL  # PP 0, TG 0: a sequence attends to half a cell on average
    assert decode_step_bytes(moe, b=1, pp=0, tg=0) == pytest.approx(1e9 + 8e9 * 2 / 8 + kv)
    # four tokens: 1 - (6/8)^4 = 68.4% of the experts; at the least, one token's 25%
    four = decode_step_bytes(moe, b=4, pp=0, tg=0)
    assert four == pytest.approx(1e9 + 8e9 * (1 - 0.75**4) + 4 * kv)
    least = decode_step_bytes(moe, b=4, pp=0, tg=0, least=True)
    assert least == pytest.approx(1e9 + 8e9 * 0.25 + 4 * kv)
    unknown = moe.model_copy(update={"expert_used_count": None})
    assert decode_step_bytes(unknown, b=1, pp=0, tg=0) is None


def test_without_the_weights_or_the_geometry_there_is_no_figure() -> None:
    assert decode_step_bytes(ModelInfo(name="x"), b=1, pp=10, tg=1) is None
    assert decode_step_bytes(ModelInfo(name="x", weight_bytes=10), b=1, pp=10, tg=1) is None


def test_mbu_is_steps_per_second_times_bytes_over_the_peak() -> None:
    depth = decode_depth(512, 128)
    assert depth == 576.5
    step = 1e9 + 4 * depth * CELL
    found = point_limit(
        b=4, pp=512, tg=128, s_tg=200.0, model=DENSE, settings=RunSettings(),
        bandwidth=_peak(400),
    )  # fmt: skip
    assert found.mbu == pytest.approx(50 * step / 400e9)
    assert found.impossible is None


def test_a_point_above_the_limit_of_a_published_figure_cannot_be_true() -> None:
    # 1 GB a step at 120 steps/s is 120 GB/s, against a 100 GB/s device
    found = point_limit(
        b=1, pp=0, tg=1, s_tg=120.0, model=DENSE, settings=RunSettings(), bandwidth=_peak(100)
    )
    assert found.mbu is not None and found.mbu > LIMIT
    assert found.impossible is not None
    assert "120 t/s at B=1" in found.impossible and "100 GB/s (table)" in found.impossible


def test_an_moe_point_is_refused_only_above_what_its_least_routing_reads() -> None:
    moe = DENSE.model_copy(
        update={"expert_bytes": 8_000_000_000, "expert_count": 8, "expert_used_count": 2}
    )
    # at B = 4 the expected step reads 1 + 5.47 GB, the least 1 + 2 GB: 30 steps a second
    # of the expected is 194 GB/s, of the least 90 GB/s, under a 100 GB/s device
    found = point_limit(
        b=4, pp=0, tg=1, s_tg=120.0, model=moe, settings=RunSettings(), bandwidth=_peak(100)
    )
    assert found.mbu is not None and found.mbu > 1.9
    assert found.impossible is None
    # at the limit it is kept
    kept = point_limit(
        b=1, pp=0, tg=1, s_tg=100.0, model=DENSE, settings=RunSettings(), bandwidth=_peak(100)
    )
    assert kept.impossible is None


def test_a_measured_figure_is_a_lower_bound_and_never_refuses() -> None:
    found = point_limit(
        b=1,
        pp=0,
        tg=1,
        s_tg=500.0,
        model=DENSE,
        settings=RunSettings(),
        bandwidth=_peak(100, "measured"),
    )
    assert found.mbu is not None and found.mbu > 4
    assert found.impossible is None


def test_a_tgs_table_steps_one_sequence_at_a_time() -> None:
    tgs = RunSettings(tg_separate=True)
    found = point_limit(b=4, pp=0, tg=1, s_tg=40.0, model=DENSE, settings=tgs, bandwidth=_peak(100))
    # 40 steps of one sequence a second, not 10 of four
    assert found.mbu == pytest.approx(40 * (1e9 + 1 * CELL) / 100e9)


def _hardware(**probes: object) -> HardwareData:
    return HardwareData.model_validate({"probes": probes})


def test_a_gpu_run_is_held_against_the_fastest_gpu_and_a_cpu_run_against_the_cpus() -> None:
    data = _hardware(
        nvidia={
            "gpus": [{"name": "NVIDIA H100 80GB HBM3"}, {"name": "NVIDIA H100 80GB HBM3"}],
            "bandwidth": [
                {"bytes_per_s": 3.35e12, "source": "nvml"},
                {"bytes_per_s": 3.0e12, "source": "nvml"},
            ],
        },
        host={"cpu_model": "x", "bandwidth": {"bytes_per_s": 2e11, "source": "measured"}},
    )
    on_gpu = node_bandwidth(data, on_accelerator=True)
    assert on_gpu is not None and on_gpu.bytes_per_s == 3.35e12
    on_cpu = node_bandwidth(data, on_accelerator=False)
    assert on_cpu is not None and (on_cpu.bytes_per_s, on_cpu.source) == (2e11, "measured")


def test_apple_silicon_and_a_declared_device_come_from_the_table() -> None:
    apple = node_bandwidth(_hardware(apple={"chip": "Apple M4 Pro"}), on_accelerator=True)
    assert apple is not None and (apple.bytes_per_s, apple.source) == (273e9, "table")
    declared = node_bandwidth(_hardware(declared={"device": "apple m4 pro"}), on_accelerator=None)
    assert declared is not None and declared.bytes_per_s == 273e9
    assert node_bandwidth(_hardware(declared={"device": "a toaster"}), on_accelerator=None) is None


def test_a_declared_name_is_spelt_as_the_table_spells_it() -> None:
    assert published_name(" apple m4 PRO ") == "Apple M4 Pro"
    assert published_name("Intel Xeon Platinum 8480+") == "Intel(R) Xeon(R) Platinum 8480+"
    assert published_name(" a toaster ") == "a toaster"


def test_a_gpu_without_a_figure_is_not_held_against_the_cpus() -> None:
    data = _hardware(
        nvidia={"gpus": [{"name": "an unlisted GPU"}]},
        host={"bandwidth": {"bytes_per_s": 2e11, "source": "measured"}},
    )
    assert node_bandwidth(data, on_accelerator=True) is None
