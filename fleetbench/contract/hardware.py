"""What the agent's probes saw of a node (`RunReport.hardware.data`): one section per probe,
its keys typed where fleetbench reads them and kept as sent where it does not. Part of the
wire format (contract.wire re-exports it); a module of its own because it is one thing."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from fleetbench.contract.bounds import MAX_MEMORY_BYTES, Figure, Int32, Text

__all__ = [
    "AmdGpu",
    "AmdProbe",
    "AppleProbe",
    "Bytes",
    "DeclaredDevice",
    "HardwareData",
    "HostProbe",
    "MemoryBandwidth",
    "NvidiaGpu",
    "NvidiaProbe",
    "Probes",
    "ShortText",
]


class _Open(BaseModel):
    """A probe's section: the keys fleetbench reads are typed; others are kept as sent."""

    model_config = ConfigDict(extra="allow")


ShortText = Annotated[Text, Field(max_length=200)]
Bytes = Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)]


class MemoryBandwidth(_Open):
    """The peak memory bandwidth of a device, and where the figure comes from: `nvml`
    (the memory's top clock x its bus width x 2 transfers per clock), `amdsmi` (the
    driver's figure), `table` (a vendor's published figure, contract.device_bandwidth),
    `measured` (a copy across every core through a buffer far larger than the caches: what
    the cores reached, a lower bound of the peak)."""

    bytes_per_s: Annotated[float, Field(gt=0, le=1e15, allow_inf_nan=False)]
    source: ShortText = Field(description="nvml, amdsmi, table or measured")
    detail: Annotated[Text, Field(max_length=500)] | None = Field(
        default=None, description="how it was read: clocks and bus, the table's source, the probe"
    )


class HostProbe(_Open):
    cpu_model: ShortText | None = None
    cpu_sockets: Int32 | None = None
    cpu_cores: Int32 | None = None
    cpu_threads: Int32 | None = None
    memory_bytes: Bytes | None = None
    os: ShortText | None = None
    os_release: ShortText | None = None
    kernel: ShortText | None = None
    arch: ShortText | None = None
    bandwidth: MemoryBandwidth | None = Field(
        default=None, description="the CPUs' memory bandwidth (measured, else published)"
    )


class NvidiaGpu(_Open):
    name: ShortText | None = None
    uuid: ShortText | None = None
    memory_bytes: Bytes | None = None
    compute_capability: ShortText | None = None
    power_limit_w: Figure | None = None


class NvidiaProbe(_Open):
    driver_version: ShortText | None = None
    cuda_version: ShortText | None = None
    gpus: list[NvidiaGpu] = Field(default_factory=list, max_length=256)
    bandwidth: list[MemoryBandwidth] = Field(
        default_factory=list, max_length=256, description="each GPU's, in the order of gpus"
    )


class AppleProbe(_Open):
    chip: ShortText | None = None
    model: ShortText | None = None
    model_name: ShortText | None = None
    memory_bytes: Bytes | None = None
    cpu_cores: Int32 | None = None
    cpu_cores_by_level: list[Int32] | None = Field(default=None, max_length=16)
    gpu: ShortText | None = None
    gpu_cores: Int32 | None = None
    bandwidth: MemoryBandwidth | None = None


class AmdGpu(_Open):
    name: ShortText | None = None
    gpu_id: ShortText | None = None
    sku: ShortText | None = None
    vbios: ShortText | None = None
    power_cap_w: Figure | None = None
    pci_bus: ShortText | None = None


class AmdProbe(_Open):
    driver_version: ShortText | None = None
    gpus: list[AmdGpu] = Field(default_factory=list, max_length=256)
    bandwidth: list[MemoryBandwidth] = Field(
        default_factory=list, max_length=256, description="each GPU's, in the order of gpus"
    )


class DeclaredDevice(_Open):
    """The device a table was measured on as whoever imported it named it (`import
    --device`): declared, not probed."""

    device: ShortText


class Probes(_Open):
    """One section per probe that found its hardware (agent/probes); a section of a probe
    this registry does not know is kept as opaque JSON."""

    host: HostProbe | None = None
    nvidia: NvidiaProbe | None = None
    apple: AppleProbe | None = None
    amd: AmdProbe | None = None
    declared: DeclaredDevice | None = None


class HardwareData(_Open):
    """What the probes saw (`fleetbench-agent fingerprint`). Plain JSON, at most
    16 levels deep and 10,000 values, text without NUL or lone surrogates."""

    probes: Probes = Field(default_factory=Probes)
    notes: dict[str, Annotated[Text, Field(max_length=4000)]] = Field(
        default_factory=dict, description="per probe, why it found nothing or failed"
    )
    complete: bool | None = Field(default=None, description="false when a probe failed")
