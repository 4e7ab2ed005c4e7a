"""The report a node sends the registry for one sweep run: fleetbench's wire format.

Defined once, here, in the contract neither side owns: the agent builds a `RunReport`, the
registry validates the same class on `POST /v1/runs`.

Versioning, a tolerant reader: a field added later is optional and needs no new version. A
registry that does not know a field a newer agent sends leaves it out and names it in the
receipt (`ignored_fields`), so agents may be upgraded before the registry. A change that an
older registry would misread gets a new `schema_version`. A registry reads its own version and
answers 422 for any other, naming which side to upgrade: 0.1.0 reads version 6, the format
the development builds before it ended with (CHANGELOG.md).
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal, get_args, get_origin
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from fleetbench.contract.bounds import (
    INT32_MAX,
    MAX_MEMORY_BYTES,
    NAME_LENGTH,
    Count,
    Figure,
    Int32,
    Moment,
    Name,
    Sha256,
    Text,
    check_json,
    inline_schema,
)
from fleetbench.contract.energy import PointEnergy, RunEnergy
from fleetbench.contract.hardware import (
    AmdGpu,
    AmdProbe,
    AppleProbe,
    DeclaredDevice,
    HardwareData,
    HostProbe,
    MemoryBandwidth,
    NvidiaGpu,
    NvidiaProbe,
    Probes,
    ShortText,
)
from fleetbench.contract.outputs import OutputFingerprint

__all__ = [
    "ERROR_LENGTH",
    "REASON_LENGTH",
    "SCHEMA_VERSION",
    "AgentIdentity",
    "AllocatedBuffer",
    "AmdGpu",
    "AmdProbe",
    "AppleProbe",
    "Contention",
    "DeclaredDevice",
    "DeviceMemoryUse",
    "EngineBuild",
    "FailedPoint",
    "HardwareData",
    "HardwareFingerprint",
    "HostProbe",
    "KvLayers",
    "MemoryBandwidth",
    "ModelInfo",
    "NvidiaGpu",
    "NvidiaProbe",
    "OutputFingerprint",
    "Point",
    "PointEnergy",
    "Probes",
    "RunEnergy",
    "RunReport",
    "RunSettings",
    "RunStatus",
    "ServerIdentity",
    "ServingPoint",
    "SloSearch",
    "defining_json",
    "model_name_key",
]

SCHEMA_VERSION = 6
MAX_LAYERS = 4096  # a model's layers, as a per-layer array lists them

# S_TG and B·TG/T_TG may differ by rounding, never by more than this share.
S_TG_TOLERANCE = 0.01

# hardware.data: plain JSON within these bounds (the whole fingerprint a few dozen KB)
HARDWARE_MAX_DEPTH = 16
HARDWARE_MAX_VALUES = 10_000
REASON_LENGTH = 4000  # a failed point's reason
ERROR_LENGTH = 20000  # a failed run's error

RunStatus = Literal["ok", "partial", "failed"]
"""ok: every planned point was measured; partial: some points failed (see `failures`);
failed: the run as a whole failed (see `error`)."""


class _Part(BaseModel):
    # A field this registry does not know is a newer agent's: left out, not refused
    # (RunReport names it in `ignored_fields`).
    model_config = ConfigDict(extra="ignore", frozen=True)


class Point(_Part):
    """One row of the llama-batched-bench table: B sequences, PP prompt and TG generated
    tokens each. Times in seconds, speeds in tokens per second. Per-user decode speed is
    `s_tg / b`."""

    pp: Int32 = Field(description="prompt tokens per sequence (PP)")
    tg: Int32 = Field(description="generated tokens per sequence (TG)")
    b: int = Field(ge=1, le=INT32_MAX, description="concurrent sequences (B)")
    n_kv: Int32 | None = Field(default=None, description="KV cells used (N_KV)")
    t_pp: Figure | None = Field(default=None, description="prefill time, s")
    s_pp: Figure | None = Field(default=None, description="prefill speed, t/s")
    t_tg: Figure | None = Field(default=None, description="decode time, s")
    s_tg: Figure | None = Field(default=None, description="total decode speed, t/s")
    t: Figure | None = Field(default=None, description="total time, s")
    s: Figure | None = Field(default=None, description="total speed, t/s")
    repeats: int = Field(default=1, ge=1, le=INT32_MAX, description="times the point was measured")
    s_pp_stdev: Figure | None = Field(
        default=None, description="spread of S_PP over repeats (sample standard deviation)"
    )
    s_tg_stdev: Figure | None = Field(
        default=None, description="spread of S_TG over repeats (sample standard deviation)"
    )
    energy: PointEnergy | None = Field(
        default=None, description="what the point cost in energy (None: not measured)"
    )

    @field_validator("s_tg")
    @classmethod
    def _s_tg_agrees_with_t_tg(cls, s_tg: float | None, info: ValidationInfo) -> float | None:
        b, tg, t_tg = info.data.get("b"), info.data.get("tg"), info.data.get("t_tg")
        if s_tg is None or t_tg is None or b is None or tg is None:
            return s_tg  # nothing to compare (or those fields failed on their own)
        if t_tg == 0:
            if b * tg > 0:
                raise ValueError(f"t_tg is 0 for {b * tg} generated tokens")
            return s_tg
        expected = b * tg / t_tg  # infinite for a subnormal t_tg: no S_TG agrees with that
        if not math.isfinite(expected) or abs(s_tg - expected) > S_TG_TOLERANCE * expected:
            raise ValueError(
                f"s_tg={s_tg} disagrees with b*tg/t_tg={expected:.6g} by more than "
                f"{S_TG_TOLERANCE:.0%}"
            )
        return s_tg


class FailedPoint(_Part):
    """A point of the planned grid that produced no measurement, and why
    (out of memory, `failed to find a memory slot`, skipped because it would not fit)."""

    pp: Int32
    tg: Int32
    b: int = Field(ge=1, le=INT32_MAX)
    reason: Text = Field(min_length=1, max_length=REASON_LENGTH)


class EngineBuild(_Part):
    """What ran the sweep. `build_number`/`commit` identify the llama.cpp build when known."""

    engine: Name = "llama.cpp"
    build_number: Int32 | None = None
    commit: Text | None = Field(default=None, max_length=64)
    backend: Text | None = Field(
        default=None, max_length=64, description="CPU, CUDA, Metal, ROCm, Vulkan, ..."
    )
    binding: Text | None = Field(
        default=None, max_length=100, description="e.g. llama-batched-bench, llama-cpp-python"
    )
    binding_version: Text | None = Field(default=None, max_length=100)


class AllocatedBuffer(_Part):
    """One buffer llama.cpp logged allocating for the sweep's model or context, e.g.
    "CUDA0 KV buffer size = 288.00 MiB" (to the nearest 10 KiB: it logs MiB to 2 decimals)."""

    kind: Literal["model", "kv", "compute", "output"] = Field(
        description="model: weights; kv: the KV cache; compute: the graph's scratch; output: "
        "logits and embeddings"
    )
    device: Text = Field(
        max_length=64, description="llama.cpp's buffer type: CPU, CPU_Mapped, CUDA0, Metal, ..."
    )
    bytes: Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)]


class DeviceMemoryUse(_Part):
    """One NVIDIA GPU's memory in use (by every process, as NVML counts it) before the sweep
    and at its most while the sweep ran: reached at the largest B, where the engine's
    scratch pool has grown to its largest, with the model and the context loaded."""

    gpu: Int32 = Field(description="NVML's index")
    total_bytes: Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)]
    before_bytes: Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)] = Field(
        description="in use before the sweep loaded its model"
    )
    peak_bytes: Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)] = Field(
        description="the most in use while it ran"
    )


class KvLayers(_Part):
    """A model's KV geometry layer by layer, as its GGUF states it: what
    llama.cpp sizes each layer's cache from where layers differ (Gemma 4's full and
    sliding-window layers, hybrids' recurrent layers, MLA, next-token-prediction and
    shared-KV layers, a sparse-attention indexer). ModelInfo's scalars still hold the
    full-attention layers' head sizes."""

    architecture: Text | None = Field(default=None, max_length=64)
    head_count_kv: list[Int32] = Field(
        max_length=MAX_LAYERS,
        description="KV heads of each layer (0: the layer keeps no KV cache, a recurrent one)",
    )
    sliding_window_layers: list[bool] | None = Field(
        default=None, max_length=MAX_LAYERS, description="whether each layer uses the window"
    )
    head_dim_k_swa: Int32 | None = Field(
        default=None, description="K head size of the sliding-window layers (key_length_swa)"
    )
    head_dim_v_swa: Int32 | None = Field(
        default=None, description="V head size of the sliding-window layers (value_length_swa)"
    )
    mla: bool = Field(
        default=False,
        description="multi-head latent attention (the GGUF has key_length_mla): K holds the "
        "latent and the rope part, V the latent, which llama.cpp b7832+ does not store",
    )
    nextn_layers: Int32 = Field(
        default=0, description="next-token-prediction layers at the end, never cached"
    )
    shared_kv_layers: Int32 = Field(
        default=0, description="layers at the end that reuse earlier layers' KV cache"
    )
    indexer_head_dim: Int32 | None = Field(
        default=None, description="a sparse-attention indexer's key size (its own K-only cache)"
    )
    indexer_layers: list[bool] | None = Field(
        default=None,
        max_length=MAX_LAYERS,
        description="the layers with an indexer cache, where the GGUF says (indexer.types)",
    )

    @model_validator(mode="after")
    def _arrays_agree(self) -> KvLayers:
        n = len(self.head_count_kv)
        for name in ("sliding_window_layers", "indexer_layers"):
            given = getattr(self, name)
            if given is not None and len(given) != n:
                raise ValueError(f"{name} has {len(given)} layers, head_count_kv {n}")
        if self.nextn_layers + self.shared_kv_layers > n:
            raise ValueError("more next-token-prediction and shared-KV layers than layers")
        return self


class ModelInfo(_Part):
    """The model measured. `name` is the display name; `sha256` of the GGUF file when known.
    Architecture numbers are those the KV-cache size follows from."""

    name: Name = Field(description="its lower-case form (how names are matched) too must fit")
    sha256: Sha256 | None = None
    quantization: Text | None = Field(default=None, max_length=64)
    n_params: Count | None = None
    file_size: Count | None = Field(default=None, description="bytes")
    n_layer: Int32 | None = None
    n_head_kv: Int32 | None = None
    head_dim_k: Int32 | None = None
    head_dim_v: Int32 | None = None
    n_ctx_train: Int32 | None = None
    sliding_window: Int32 | None = Field(
        default=None, description="sliding-window size of the SWA layers, in tokens"
    )
    n_swa_layers: Int32 | None = Field(
        default=None, description="layers that attend within the sliding window only"
    )
    layers: KvLayers | None = Field(default=None, description="the KV geometry layer by layer")
    weight_bytes: Count | None = Field(
        default=None,
        description="bytes of the tensors every decode step reads whole: every layer's, the "
        "output's (the token embedding's only where the output is tied to it: otherwise a "
        "step reads one row of it), the routed experts' not",
    )
    expert_bytes: Count | None = Field(
        default=None, description="bytes of a mixture of experts' routed experts, all of them"
    )
    expert_count: Int32 | None = Field(default=None, description="routed experts per layer")
    expert_used_count: Int32 | None = Field(
        default=None, description="experts each token is routed to, per layer"
    )

    @field_validator("name")
    @classmethod
    def _key_fits(cls, name: str) -> str:
        key = model_name_key(name)
        if len(key) > NAME_LENGTH:  # lower-casing can lengthen it: "İ" is two characters
            raise ValueError(
                f"its lower-case form, by which models are matched, is {len(key)} characters, "
                f"over {NAME_LENGTH}"
            )
        return name


def model_name_key(name: str) -> str:
    """How model names compare: case-insensitive, with or without `.gguf`."""
    return name.strip().lower().removesuffix(".gguf")


class RunSettings(_Part):
    """The settings that shape the results (llama-batched-bench's flags)."""

    n_ctx: Int32 | None = None
    n_batch: Int32 | None = None
    n_ubatch: Int32 | None = None
    flash_attn: Literal["on", "off", "auto"] | None = None
    kv_unified: bool | None = None
    pp_shared: bool | None = None
    tg_separate: bool | None = None
    n_gpu_layers: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = Field(
        default=None, description="-1: all"
    )
    n_threads: Int32 | None = None
    n_threads_batch: Int32 | None = None
    cache_type_k: Text | None = Field(default=None, max_length=16)
    cache_type_v: Text | None = Field(default=None, max_length=16)
    swa_full: bool | None = Field(
        default=None,
        description="sliding-window layers kept a cache as large as the context's (llama.cpp's "
        "--swa-full; the library's default)",
    )


class HardwareFingerprint(_Part):
    """What defines the machine: `hash` is stable across reboots; `data` is the full probe
    output it was computed from, in the shape of HardwareData (kept exactly as sent)."""

    hash: Text = Field(min_length=8, max_length=128)
    data: Annotated[
        dict[str, Any], WithJsonSchema(inline_schema(HardwareData), mode="validation")
    ] = Field(default_factory=dict)

    @field_validator("data")
    @classmethod
    def _shape(cls, data: dict[str, Any]) -> dict[str, Any]:
        check_json(data, max_depth=HARDWARE_MAX_DEPTH, max_items=HARDWARE_MAX_VALUES)
        HardwareData.model_validate(data)  # raises naming the key; the dict is kept as sent
        return data


class Contention(_Part):
    """What else used the node while a run measured (agent/contention.py): other
    processes' CPU time, the load, other processes on its GPUs. `reason` says why the run
    counts as measured under contention (the agent's thresholds); None: it does not."""

    seconds: Figure = Field(description="wall seconds watched")
    cpu_count: Int32 | None = Field(default=None, description="logical CPUs")
    other_cpu_share: Figure | None = Field(
        default=None,
        description="CPU time of every other process over seconds x cpu_count (0 to 1)",
    )
    load_average_max: Figure | None = Field(
        default=None, description="the highest 1-minute load average seen"
    )
    gpu_processes: list[ShortText] = Field(
        default_factory=list, max_length=64, description="other processes on its GPUs: pid name"
    )
    reason: Annotated[Text, Field(min_length=1, max_length=1000)] | None = None


class AgentIdentity(_Part):
    """The program that made the report, and its version."""

    name: Name = "fleetbench-agent"
    version: ShortText = Field(description="e.g. 0.1.0")


class ServerIdentity(_Part):
    """The server a serving run measured, as it said itself (llama-server's /props and
    /slots, vLLM's /version, Ollama's /api/version), and the requests it was sent."""

    kind: Literal["llama-server", "vllm", "ollama", "openai-compatible"]
    build: ShortText | None = None
    model_path: Annotated[Text, Field(max_length=1000)] | None = None
    n_ctx: Int32 | None = None
    slots: Int32 | None = None
    ctx_per_slot: Int32 | None = None
    prompt_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)]
    gen_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)]
    prompt_exact: bool = Field(description="prompts counted by the server's tokenizer")


class ServingPoint(_Part):
    """One concurrency of a serving run: C requests in flight, every token timestamped by
    the client. Speeds in tokens/s, latencies in ms; percentiles across the completed
    requests (None: none completed)."""

    concurrency: Annotated[int, Field(ge=1, le=INT32_MAX)]
    requests: Int32
    completed: Int32
    output_tokens: Count
    seconds: Figure
    total_tps: Figure | None = None
    per_user_tps_p10: Figure | None = None
    per_user_tps_p50: Figure | None = None
    per_user_tps_p90: Figure | None = None
    ttft_ms_p50: Figure | None = None
    ttft_ms_p90: Figure | None = None
    ttft_ms_p99: Figure | None = None
    itl_ms_p50: Figure | None = None
    itl_ms_p90: Figure | None = None
    itl_ms_p99: Figure | None = None
    e2e_ms_p50: Figure | None = None
    e2e_ms_p90: Figure | None = None
    e2e_ms_p99: Figure | None = None
    errors: dict[ShortText, Int32] = Field(default_factory=dict, max_length=32)


class SloSearch(_Part):
    """A serving run that searched for the largest concurrency meeting an objective
    (contract.serve_spec.Objective): what it found, and why it stopped there."""

    objective: Annotated[Text, Field(min_length=1, max_length=500)]
    concurrency: Int32 | None = Field(
        description="the largest concurrency measured to meet it (None: not even the first); "
        "a search stopped early (a throughput plateau, the time budget) may not have reached "
        "the largest that would: see stop_reason"
    )
    stop_reason: Annotated[Text, Field(min_length=1, max_length=1000)] = Field(
        description="objective failed at C, throughput plateau, errors, time budget, ..."
    )


class RunReport(_Part):
    """One sweep run of one model on one node, with every measured and failed point.

    Rules across fields (each answered 422 naming the field): `ok` has points and no
    failures, `partial` has both, `failed` has an `error`; `finished_at` is not before
    `started_at`; no two points share PP, TG and B; where a point gives both S_TG and T_TG,
    S_TG is within 1% of B·TG/T_TG (and T_TG is not 0 when tokens were generated); a model
    name's lower-case form fits 200 characters. A registry may bound points per report and
    points per node lower than the schema does (FLEETBENCH_MAX_POINTS_PER_REPORT,
    FLEETBENCH_MAX_SERIES_PER_NODE): over them it answers 422 saying which."""

    schema_version: int = Field(
        ge=SCHEMA_VERSION,
        le=SCHEMA_VERSION,
        description="the wire format's version (this module's docstring); any other than the "
        "registry's is refused, naming both",
    )
    run_id: UUID = Field(description="chosen by the client; a retry sends the same id")
    node: Name
    started_at: Moment
    finished_at: Moment | None = None
    status: RunStatus = "ok"
    error: Text | None = Field(default=None, max_length=ERROR_LENGTH)
    source: Literal["sweep", "import"] = "sweep"
    engine: EngineBuild = Field(default_factory=EngineBuild)
    model: ModelInfo
    settings: RunSettings = Field(default_factory=RunSettings)
    hardware: HardwareFingerprint | None = None
    points: list[Point] = Field(default_factory=list, max_length=100_000)
    failures: list[FailedPoint] = Field(default_factory=list, max_length=100_000)
    kind: Literal["offline", "serving"] = Field(
        default="offline",
        description="offline: the engine's batched-bench table (`points`); serving: a "
        "server's, one `serving_points` entry per concurrency",
    )
    server: ServerIdentity | None = None
    serving_points: list[ServingPoint] = Field(default_factory=list, max_length=10_000)
    slo_search: SloSearch | None = Field(default=None, description="a serving run's SLO search")
    buffers: list[AllocatedBuffer] = Field(
        default_factory=list,
        max_length=256,
        description="an offline run's memory as llama.cpp allocated it, one entry per buffer "
        "it logged",
    )
    device_memory: list[DeviceMemoryUse] = Field(
        default_factory=list, max_length=64, description="an offline run's GPUs"
    )
    contention: Contention | None = Field(
        default=None,
        description="what else used the node while it ran (None: not watched, e.g. an import)",
    )
    energy: RunEnergy | None = Field(
        default=None,
        description="where its points' energy figures come from (None: the node has no "
        "counter it can read)",
    )
    outputs: OutputFingerprint | None = Field(
        default=None,
        description="the model's outputs on fleetbench's reference text, taken after the "
        "points or levels (contract.outputs; None: not taken)",
    )
    agent: AgentIdentity | None = Field(
        default=None,
        description="what made the report (fleetbench's agent always says); not part of "
        "the run's identity, so a retry from an upgraded agent is the same run",
    )

    @field_validator("points")
    @classmethod
    def _one_point_per_cell(cls, points: list[Point]) -> list[Point]:
        seen: set[tuple[int, int, int]] = set()
        for point in points:
            cell = (point.pp, point.tg, point.b)
            if cell in seen:
                raise ValueError(f"PP={cell[0]} TG={cell[1]} B={cell[2]} is given twice")
            seen.add(cell)
        return points

    _ignored_fields: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _name_fields_not_known(
        cls, data: Any, handler: ModelWrapValidatorHandler[RunReport]
    ) -> RunReport:
        ignored = _fields_not_known(data) if isinstance(data, dict) else []
        report = handler(data)
        report._ignored_fields = tuple(ignored)
        return report

    @property
    def ignored_fields(self) -> list[str]:
        """What the report held that this version of the contract does not know (a newer
        agent's fields), left out: `settings.new_knob`, `points[].new_figure`."""
        return list(self._ignored_fields)

    @field_validator("schema_version", mode="before")
    @classmethod
    def _this_version(cls, version: object) -> object:
        if isinstance(version, int) and version != SCHEMA_VERSION:
            newer = version > SCHEMA_VERSION
            raise ValueError(
                f"schema version {version} is {'newer' if newer else 'older'} than this "
                f"registry's ({SCHEMA_VERSION}): upgrade the {'registry' if newer else 'agent'}"
            )
        return version

    @model_validator(mode="after")
    def _kind_matches_contents(self) -> RunReport:
        if self.kind == "serving":
            if self.server is None or self.points:
                raise ValueError("a serving run has its server and serving_points, no points")
            levels = [p.concurrency for p in self.serving_points]
            if len(set(levels)) != len(levels):
                raise ValueError(f"a concurrency is given twice: {levels}")
            if self.buffers or self.device_memory:
                raise ValueError("buffers and device_memory belong to offline runs")
        elif self.server is not None or self.serving_points or self.slo_search is not None:
            raise ValueError("server, serving_points and slo_search belong to serving runs")
        return self

    @model_validator(mode="after")
    def _energy_has_a_source(self) -> RunReport:
        if self.energy is None and any(p.energy is not None for p in self.points):
            raise ValueError("points carry energy but `energy` names no source")
        return self

    @model_validator(mode="after")
    def _status_matches_contents(self) -> RunReport:
        measured = self.points or self.serving_points
        if self.status == "ok" and self.failures:
            raise ValueError("status 'ok' with failed points: use 'partial'")
        if self.status == "partial" and not self.failures:
            raise ValueError("status 'partial' without failed points: use 'ok'")
        if self.status != "failed" and not measured:
            raise ValueError(f"status {self.status!r} with no points: use 'failed'")
        if self.status == "failed" and not self.error:
            raise ValueError("status 'failed' needs an error")
        if self.finished_at is not None and self.finished_at < self.started_at:
            raise ValueError("finished_at is before started_at")
        return self


def _fields_not_known(data: dict[str, Any], model: type[BaseModel] = RunReport) -> list[str]:
    """The keys of `data` that `model` does not know, and of its parts' (`settings.x`) and
    of its lists' entries (`points[].x`), in the order of the model's fields."""
    unknown = [key for key in data if key not in model.model_fields]
    for name, (part, many) in _parts_of(model).items():
        given = data.get(name)
        if many and isinstance(given, list):
            keys = {key: None for entry in given if isinstance(entry, dict) for key in entry}
            unknown += [f"{name}[].{key}" for key in _fields_not_known(keys, part)]
        elif isinstance(given, dict):
            unknown += [f"{name}.{key}" for key in _fields_not_known(given, part)]
    return unknown


@functools.cache
def _parts_of(model: type[BaseModel]) -> dict[str, tuple[type[BaseModel], bool]]:
    """The fields of `model` that hold a part of the report, or a list of them (True)."""
    parts = {}
    for name, field in model.model_fields.items():
        found = _part_in(field.annotation)
        if found is not None:
            parts[name] = found
    return parts


def _part_in(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    # a part: a model that ignores keys it does not know (wire's and contract.energy's)
    if (
        isinstance(annotation, type)
        and issubclass(annotation, BaseModel)
        and annotation.model_config.get("extra") == "ignore"
    ):
        return annotation, False
    if get_origin(annotation) is list:
        inner = _part_in(get_args(annotation)[0])
        return (inner[0], True) if inner is not None else None
    for argument in get_args(annotation):  # X | None
        if (inner := _part_in(argument)) is not None:
            return inner
    return None


def defining_json(report: RunReport, *, exclude: set[str] | None = None) -> str:
    """The report as the fields that define the run: every field not at its default, the
    schema version and the agent that sent it aside. A retry's identity (the registry's
    digest) and an import's run id are made of it, so a field added later with a default
    changes neither, nor does upgrading the agent."""
    return report.model_dump_json(
        exclude_defaults=True, exclude={"schema_version", "agent", *(exclude or ())}
    )
