"""The table of vendors' published memory bandwidths (contract/device_bandwidth.py)."""

from __future__ import annotations

import pytest

from fleetbench.contract.device_bandwidth import PUBLISHED, device_key, published_bandwidth

GB = 1e9


def test_apple_m4_pro_is_273_gb_per_s_from_apple() -> None:
    figure = published_bandwidth("Apple M4 Pro")
    assert figure is not None
    assert (figure.bytes_per_s, figure.source) == (273 * GB, "table")
    assert figure.detail is not None and "apple.com" in figure.detail


def test_m4_max_bins_are_told_apart_by_gpu_cores() -> None:
    assert [
        figure.bytes_per_s if (figure := published_bandwidth("Apple M4 Max", gpu_cores=n)) else None
        for n in (32, 40, 38, None)
    ] == [410 * GB, 546 * GB, None, None]  # a bin the table lacks, or none named: no guess


def test_a_name_the_table_lacks_has_no_figure() -> None:
    assert published_bandwidth("Apple M5 Max") is None
    assert published_bandwidth("NVIDIA GeForce RTX 5090") is None
    assert published_bandwidth("") is None


def test_nvml_names_of_gpus_look_up_their_figures() -> None:
    figures = {
        name: figure.bytes_per_s if (figure := published_bandwidth(name)) else None
        for name in (
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA GeForce RTX 4090",
            "AMD Instinct MI300X",
        )
    }
    assert figures == {
        "NVIDIA H100 80GB HBM3": 3350 * GB,
        "NVIDIA H100 PCIe": 2000 * GB,
        "NVIDIA A100-SXM4-80GB": 2039 * GB,
        "NVIDIA A100-SXM4-40GB": 1555 * GB,
        "NVIDIA GeForce RTX 4090": 1008 * GB,
        "AMD Instinct MI300X": 5300 * GB,
    }


def test_a_cpu_s_figure_is_per_socket_and_sockets_multiply() -> None:
    one = published_bandwidth("AMD EPYC 9654 96-Core Processor")
    two = published_bandwidth("AMD EPYC 9654 96-Core Processor", sockets=2)
    assert one is not None and two is not None
    assert (one.bytes_per_s, two.bytes_per_s) == pytest.approx((460.8 * GB, 921.6 * GB))
    assert two.detail is not None and two.detail.endswith("x2 sockets")
    # a GPU's figure is the device's own: sockets do not multiply it
    gpu = published_bandwidth("NVIDIA L4", sockets=2)
    assert gpu is not None and gpu.bytes_per_s == 300 * GB


def test_names_compare_without_case_spacing_or_trademark_marks() -> None:
    cpuinfo = "Intel(R) Xeon(R) Platinum 8480+"
    assert device_key(cpuinfo) == device_key("intel xeon  platinum 8480+")
    assert device_key("Intel® Xeon® Platinum 8480+") == "intel xeon platinum 8480+"
    assert device_key("AMD Ryzen(TM) 9 7950X") == "amd ryzen 9 7950x"
    figure = published_bandwidth("INTEL(R) XEON(R) PLATINUM 8480+", sockets=2)
    assert figure is not None and figure.bytes_per_s == pytest.approx(614.4 * GB)
    assert published_bandwidth("apple  m4 pro") == published_bandwidth("Apple M4 Pro")


def test_every_row_names_its_source_and_no_device_is_listed_twice_for_one_bin() -> None:
    assert all(row.source.startswith("https://") for row in PUBLISHED)
    bins = [(row.key, row.gpu_cores) for row in PUBLISHED]
    assert len(bins) == len(set(bins))
