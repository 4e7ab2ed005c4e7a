"""Vendors' published peak memory bandwidths, for devices whose own driver cannot say it
(Apple silicon; a GPU on an old NVIDIA driver or without amd-smi; a CPU whose measurement
failed) and for tables imported from a device named by hand (`import --device`).

Each row is one device as its probe names it (Apple's chip name, NVML's GPU name, the
CPU's model as /proc/cpuinfo gives it), its figure in bytes per second and the page that
publishes it. A device with bins of different bandwidth under one name is keyed with the
GPU cores that tell them apart; a name the table does not hold has no figure, never a
guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetbench.contract.wire import MemoryBandwidth

__all__ = ["PUBLISHED", "Published", "device_key", "published_bandwidth", "published_name"]

GB = 1e9


@dataclass(frozen=True)
class Published:
    device: str
    bytes_per_s: float
    source: str  # where the vendor publishes it
    gpu_cores: int | None = None  # the bin, where bins of one name differ
    per_socket: bool = False  # a CPU's figure, for each of its sockets

    @property
    def key(self) -> str:
        return device_key(self.device)


_APPLE_M1 = "https://support.apple.com/kb/SP854 (M1), SP858 (M1 Pro/Max), SP869 (M1 Ultra)"
_APPLE_M2 = "https://support.apple.com/kb/SP869 and apple.com/newsroom (M2 family)"
_APPLE_M3 = "https://www.apple.com/newsroom/2023/10/apple-unveils-m3-m3-pro-and-m3-max/"
_APPLE_M4 = "https://www.apple.com/macbook-pro/specs/ (M4, M4 Pro, M4 Max)"
_NVIDIA_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM, H100 NVL)"
_NVIDIA_H100_PCIE = (
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (H100 PCIe)"
)
_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM, H200 NVL)"
_NVIDIA_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_NVIDIA_ADA = (
    "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
    " (Table 1, GeForce RTX 4090)"
)
_NVIDIA_GA102 = (
    "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
    " (GeForce RTX 3090)"
)
_AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"
_AMD_MI250X = (
    "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"
    " (3.2 TB/s for the package's two dies, 4096 bit x 3.2 GT/s each)"
)
_AMD_EPYC_9654 = (
    "https://www.amd.com/en/products/processors/server/epyc/4th-generation-9004-and-8004-series/"
    "amd-epyc-9654.html (12 channels DDR5-4800)"
)
_AMD_EPYC_7763 = (
    "https://www.amd.com/en/products/processors/server/epyc/7003-series/amd-epyc-7763.html"
    " (8 channels DDR4-3200)"
)
_INTEL_8480 = (
    "https://www.intel.com/content/www/us/en/products/sku/231746/"
    "intel-xeon-platinum-8480-processor-105m-cache-2-00-ghz/specifications.html"
    " (8 channels DDR5-4800)"
)

PUBLISHED: tuple[Published, ...] = (
    Published("Apple M1", 68.25 * GB, _APPLE_M1),
    Published("Apple M1 Pro", 200 * GB, _APPLE_M1),
    Published("Apple M1 Max", 400 * GB, _APPLE_M1),
    Published("Apple M1 Ultra", 800 * GB, _APPLE_M1),
    Published("Apple M2", 100 * GB, _APPLE_M2),
    Published("Apple M2 Pro", 200 * GB, _APPLE_M2),
    Published("Apple M2 Max", 400 * GB, _APPLE_M2),
    Published("Apple M2 Ultra", 800 * GB, _APPLE_M2),
    Published("Apple M3", 100 * GB, _APPLE_M3),
    Published("Apple M3 Pro", 150 * GB, _APPLE_M3),
    Published("Apple M3 Max", 300 * GB, _APPLE_M3, gpu_cores=30),
    Published("Apple M3 Max", 400 * GB, _APPLE_M3, gpu_cores=40),
    Published("Apple M4", 120 * GB, _APPLE_M4),
    Published("Apple M4 Pro", 273 * GB, _APPLE_M4),
    Published("Apple M4 Max", 410 * GB, _APPLE_M4, gpu_cores=32),
    Published("Apple M4 Max", 546 * GB, _APPLE_M4, gpu_cores=40),
    # NVIDIA, as NVML names each GPU (nvmlDeviceGetName); NVML's own clocks and bus width
    # come first (agent/probes/nvidia.py), these only where a driver cannot say them
    Published("NVIDIA H100 80GB HBM3", 3350 * GB, _NVIDIA_H100),  # H100 SXM
    Published("NVIDIA H100 NVL", 3900 * GB, _NVIDIA_H100),
    Published("NVIDIA H100 PCIe", 2000 * GB, _NVIDIA_H100_PCIE),
    Published("NVIDIA H200", 4800 * GB, _NVIDIA_H200),  # H200 SXM
    Published("NVIDIA H200 NVL", 4800 * GB, _NVIDIA_H200),
    Published("NVIDIA A100-SXM4-80GB", 2039 * GB, _NVIDIA_A100),
    Published("NVIDIA A100-SXM4-40GB", 1555 * GB, _NVIDIA_A100),
    Published("NVIDIA A100 80GB PCIe", 1935 * GB, _NVIDIA_A100),
    Published("NVIDIA A100-PCIE-40GB", 1555 * GB, _NVIDIA_A100),
    Published("NVIDIA L40S", 864 * GB, "https://www.nvidia.com/en-us/data-center/l40s/"),
    Published("NVIDIA L4", 300 * GB, "https://www.nvidia.com/en-us/data-center/l4/"),
    Published("NVIDIA GeForce RTX 4090", 1008 * GB, _NVIDIA_ADA),
    Published("NVIDIA GeForce RTX 3090", 936 * GB, _NVIDIA_GA102),
    # AMD Instinct, as rocm-smi's "Card Series" and amd-smi's MARKET_NAME name them
    Published("AMD Instinct MI300X", 5300 * GB, _AMD_MI300X),
    # each of an MI250X's two dies is a GPU of its own to the driver, with half the memory
    Published("AMD Instinct MI250X", 1638.4 * GB, _AMD_MI250X),
    # Server CPUs as /proc/cpuinfo names them, per socket: memory channels x MT/s x 8 bytes
    Published("AMD EPYC 9654 96-Core Processor", 460.8 * GB, _AMD_EPYC_9654, per_socket=True),
    Published("AMD EPYC 7763 64-Core Processor", 204.8 * GB, _AMD_EPYC_7763, per_socket=True),
    Published("Intel(R) Xeon(R) Platinum 8480+", 307.2 * GB, _INTEL_8480, per_socket=True),
)


def device_key(name: str) -> str:
    """How device names compare: case, spacing and trademark marks aside."""
    name = re.sub(r"\((?:r|tm)\)|[®™]", "", name, flags=re.IGNORECASE)
    return " ".join(name.lower().split())


def published_name(device: str) -> str:
    """`device` as the table spells it where the table holds it, else as given (trimmed):
    one name, so one hardware class, however it was typed."""
    key = device_key(device)
    return next((row.device for row in PUBLISHED if row.key == key), device.strip())


def published_bandwidth(
    device: str, *, gpu_cores: int | None = None, sockets: int | None = None
) -> MemoryBandwidth | None:
    """The published peak of `device` (its bin by `gpu_cores` where bins differ; a CPU's
    times its `sockets`), or None where the table has no single figure for it."""
    rows = [row for row in PUBLISHED if row.key == device_key(device)]
    if len(rows) > 1:
        rows = [row for row in rows if row.gpu_cores == gpu_cores]
    if len(rows) != 1:
        return None
    row = rows[0]
    times = (sockets or 1) if row.per_socket else 1
    detail = f"{row.device}: {row.source}" + (f", x{times} sockets" if times > 1 else "")
    return MemoryBandwidth(bytes_per_s=row.bytes_per_s * times, source="table", detail=detail)
