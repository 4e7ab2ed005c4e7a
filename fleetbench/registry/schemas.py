"""What the registry's API answers (the request side is the wire format, fleetbench.contract.wire).
Named by role: XPublic for one thing, XsPublic(data, count) for a page of them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, cast
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from fleetbench.contract import bounds as wire_bounds
from fleetbench.contract import wire
from fleetbench.contract.allocation import kv_prediction_error_pct
from fleetbench.contract.answers import RegressionPublic, RegressionsPublic, SeriesKey
from fleetbench.contract.bounds import Text
from fleetbench.contract.energy import tokens_per_joule
from fleetbench.contract.kv_cache import rules_for
from fleetbench.contract.plans import PlanState
from fleetbench.registry.health import Health
from fleetbench.registry.models import Regression, Run, Token
from fleetbench.registry.regressions.knee_shifts import KNEE_METRIC
from fleetbench.registry.regressions.output_shifts import OUTPUTS_METRIC
from fleetbench.registry.regressions.rules import detectable_change
from fleetbench.registry.regressions.series import StepMetric
from fleetbench.registry.regressions.store import is_regression
from fleetbench.registry.tokens import Scope, TokenState, node_rule, token_state

__all__ = [
    "Acknowledgement",
    "CurvePointPublic",
    "CurvePublic",
    "CurvesPublic",
    "FingerprintPublic",
    "ModelPublic",
    "ModelsPublic",
    "NodeDetail",
    "NodePublic",
    "NodesPublic",
    "RegressionPublic",
    "RegressionsPublic",
    "Rotation",
    "RunDetail",
    "RunPublic",
    "RunsPublic",
    "SeriesKey",
    "SeriesPointPublic",
    "SeriesPublic",
    "ServingCurvePointPublic",
    "ServingCurvePublic",
    "TokenCreated",
    "TokenPublic",
    "TokenRequest",
    "TokensPublic",
    "regression_public",
    "run_detail",
    "run_public",
    "token_public",
]


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class BelowClassPublic(_Public):
    hardware_class: str
    model: str
    mbu: float = Field(description="the node's best MBU at B = 1 on the model")
    class_median: float = Field(description="the median of its class's nodes on the model")
    class_nodes: int


class NodePublic(_Public):
    name: str
    labels: dict[str, Any]
    created_at: datetime
    last_run_at: datetime | None
    runs: int
    hardware: str | None = Field(description="the latest run's hardware, described")
    hardware_class: str | None = Field(
        default=None,
        description="its class, as compare and prices name it (`hardware` without the driver)",
    )
    engine: str | None = Field(description="the latest run's engine build")
    last_status: wire.RunStatus | None
    open_regressions: int = Field(
        description="regressions not acknowledged that no later step in their series ended"
    )
    plans: list[PlanState] = Field(description="its sweep plans, as it last reported them")
    status_reported_at: datetime | None = Field(description="when it last reported them")
    next_run_at: datetime | None = Field(description="its next sweep, as it said")
    missed_schedule: bool = Field(
        description="next_run_at passed more than FLEETBENCH_MISSED_AFTER_MINUTES ago"
    )
    sweep_requested_at: datetime | None = Field(
        description="an admin asked it to sweep now; it has not said it did yet"
    )
    accelerator_note: str | None = Field(
        default=None,
        description="its latest run measured the CPU although the node has a GPU, and why",
    )
    kv_prediction_error_pct: float | None = Field(
        default=None,
        description="its latest run's KV cache: (predicted - allocated) / allocated, in %",
    )
    below_class: BelowClassPublic | None = Field(
        default=None,
        description="its memory-bandwidth utilisation at B = 1 is under 70% of the median of "
        "its hardware class's nodes on a model (classes of 3 nodes or more): a power cap, a "
        "wrong build, a thermal limit, a neighbour (null: it is not)",
    )
    health: Health


class NodesPublic(_Public):
    data: list[NodePublic]
    count: int


class FingerprintPublic(_Public):
    hash: str
    data: dict[str, Any]
    first_seen: datetime
    last_seen: datetime


class NodeDetail(NodePublic):
    fingerprints: list[FingerprintPublic]


class ModelPublic(wire.ModelInfo):
    model_config = ConfigDict(from_attributes=True, frozen=True)
    fact_sets: int = Field(
        description="how many distinct sets of facts nodes reported for it (the one shown: "
        "what most nodes' latest runs came with)"
    )
    runs: int
    last_run_at: datetime | None


class ModelsPublic(_Public):
    data: list[ModelPublic]
    count: int


class RunPublic(_Public):
    id: UUID
    reported_id: UUID = Field(description="the run id its node gave it (unique per node)")
    node: str
    model: str
    model_sha256: str | None
    status: wire.RunStatus
    error: str | None
    source: str
    agent: str | None = Field(
        default=None, description='what made the report: "fleetbench-agent 0.1.0"'
    )
    kind: Literal["offline", "serving"]
    started_at: datetime
    finished_at: datetime | None
    received_at: datetime
    engine: wire.EngineBuild
    settings: wire.RunSettings
    engine_on_accelerator: bool | None = Field(
        default=None,
        description="whether it measured its node's GPU (false: the engine ran on the CPU "
        "backend, or offloaded no layer, on a node with one; null: the node has none, or "
        "what the engine ran on is not known)",
    )
    accelerator_note: str | None = Field(default=None, description="why not, when it did not")
    kv_predicted_bytes: int | None = Field(
        default=None,
        description="the KV cache the maths predicts for the run's context (what placement's "
        "fit check uses)",
    )
    kv_allocated_bytes: int | None = Field(
        default=None, description="the KV cache llama.cpp allocated (null: not logged)"
    )
    kv_prediction_error_pct: float | None = Field(
        default=None,
        description="(predicted - allocated) / allocated, in %: how far placement's fit "
        "maths was from what llama.cpp allocated for this run",
    )
    kv_rules: str | None = Field(
        default=None,
        description="which of llama.cpp's rules predicted kv_predicted_bytes, for the run's "
        "build (null: no prediction)",
    )
    bandwidth: wire.MemoryBandwidth | None = Field(
        default=None,
        description="the peak memory bandwidth its points' MBU is held against, from its "
        "fingerprint (null: unknown)",
    )
    contention: wire.Contention | None = Field(
        default=None, description="what else used the node while it ran (null: not watched)"
    )
    contended: str | None = Field(
        default=None,
        description="why it counts as measured under contention (null: it does not): such a "
        "run joins no curve, placement, regression series or compare",
    )
    energy: wire.RunEnergy | None = Field(
        default=None,
        description="what counted its points' energy, and what that covers (null: nothing)",
    )


class RunsPublic(_Public):
    data: list[RunPublic]
    count: int


class PointDetail(wire.Point):
    """A point as stored, held against its node's bandwidth."""

    mbu: float | None = Field(
        default=None,
        description="memory-bandwidth utilisation (docs/design/bandwidth.md; null: unknown)",
    )
    impossible: str | None = Field(
        default=None,
        description="why it cannot be true (above the device's bandwidth), null where it can: "
        "such a point joins no curve, placement or regression series",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="generated tokens (B x TG) per joule of `energy` (null: none counted)"
    )
    @property
    def tokens_per_joule(self) -> float | None:
        return tokens_per_joule(self.b, self.tg, self.energy.joules if self.energy else None)


class OutputsTaken(BaseModel):
    """What a run's output fingerprint holds (the fingerprint itself is compare's to read)."""

    text_version: str
    positions: int
    top_k: int
    seconds: float | None = Field(description="what taking it cost the sweep")


def _outputs_taken(outputs: dict[str, Any] | None) -> OutputsTaken | None:
    if not outputs:
        return None
    ids = outputs.get("ids") or []
    return OutputsTaken(
        text_version=str(outputs.get("text_version")),
        positions=len(ids),
        top_k=len(ids[0]) if ids else 0,
        seconds=outputs.get("seconds"),
    )


class RunDetail(RunPublic):
    hardware: FingerprintPublic | None
    points: list[PointDetail]
    failures: list[wire.FailedPoint]
    server: wire.ServerIdentity | None = Field(description="a serving run's server")
    serving_points: list[wire.ServingPoint]
    slo_search: wire.SloSearch | None = Field(
        default=None,
        description="a serving run's search for the largest concurrency meeting "
        "an objective: what it found and why it stopped",
    )
    buffers: list[wire.AllocatedBuffer] = Field(
        default_factory=list, description="every buffer llama.cpp logged allocating"
    )
    device_memory: list[wire.DeviceMemoryUse] = Field(
        default_factory=list, description="each NVIDIA GPU's memory in use, before and at most"
    )
    outputs: OutputsTaken | None = Field(
        default=None,
        description="the model's output fingerprint on the reference text, as taken (null: "
        "none; docs/design/outputs.md)",
    )


def _run_fields(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "reported_id": run.reported_id,
        "node": run.node.name,
        "model": run.model.name,
        "model_sha256": run.model.sha256,
        "status": run.status,
        "error": run.error,
        "source": run.source,
        "agent": run.agent,
        "kind": run.kind,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "received_at": run.received_at,
        "engine": wire.EngineBuild.model_validate(run.build, from_attributes=True),
        "settings": wire.RunSettings.model_validate(run, from_attributes=True),
        "engine_on_accelerator": run.engine_on_accelerator,
        "accelerator_note": run.accelerator_note,
        "kv_predicted_bytes": run.kv_predicted_bytes,
        "kv_allocated_bytes": run.kv_allocated_bytes,
        "kv_prediction_error_pct": kv_prediction_error_pct(
            run.kv_predicted_bytes, run.kv_allocated_bytes
        ),
        "kv_rules": rules_for(run.build.build_number)
        if run.kv_predicted_bytes is not None
        else None,
        "bandwidth": run.bandwidth,
        "contention": run.contention,
        "contended": run.contention_reason,
        "energy": run.energy,
    }


def run_public(run: Run) -> RunPublic:
    return RunPublic.model_validate(_run_fields(run))


def run_detail(run: Run) -> RunDetail:
    return RunDetail.model_validate(
        {
            **_run_fields(run),
            "hardware": run.fingerprint,
            "points": [PointDetail.model_validate(p, from_attributes=True) for p in run.points],
            "failures": [
                wire.FailedPoint.model_validate(f, from_attributes=True) for f in run.failures
            ],
            "server": run.server,
            "slo_search": run.slo_search,
            "buffers": run.buffers or [],
            "device_memory": run.device_memory or [],
            "outputs": _outputs_taken(run.outputs),
            "serving_points": [
                wire.ServingPoint.model_validate(p, from_attributes=True)
                for p in run.serving_points
            ],
        }
    )


class TokenPublic(BaseModel):
    """A token as lists show it: never its secret."""

    id: int
    scope: Scope
    name: str | None
    node: str | None = Field(description="a node token's node")
    state: TokenState
    created_at: datetime
    last_used_at: datetime | None = Field(description="to within ten minutes")
    expires_at: datetime | None
    revoked_at: datetime | None


class TokensPublic(BaseModel):
    data: list[TokenPublic]
    count: int


class TokenRequest(BaseModel):
    """A token to create: a node token names its node (made if new); others name none."""

    model_config = ConfigDict(extra="forbid")

    scope: Scope
    node: wire_bounds.Name | None = None
    name: Text | None = Field(default=None, max_length=200)
    expires_in_days: float | None = Field(default=None, gt=0, le=36_500, allow_inf_nan=False)

    @model_validator(mode="after")
    def _node_for_node_tokens(self) -> TokenRequest:
        if (problem := node_rule(self.scope, self.node)) is not None:
            raise ValueError(problem)
        return self


class TokenCreated(TokenPublic):
    token: str = Field(description="the secret: shown this once, stored only hashed")


class Rotation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_hours: float = Field(
        default=24, ge=0, le=8760, allow_inf_nan=False, description="the old one works this long"
    )


def token_public(row: Token) -> TokenPublic:
    return TokenPublic(
        id=row.id,
        scope=cast(Any, row.scope),
        name=row.name,
        node=row.node.name if row.node else None,
        state=token_state(row),
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


class Acknowledgement(BaseModel):
    note: Text = Field(min_length=1, max_length=4000, description="why it is accepted")


def regression_public(row: Regression) -> RegressionPublic:
    return RegressionPublic(
        id=row.id,
        node=row.node.name,
        model=row.model.name,
        pp=row.pp,
        tg=row.tg,
        b=row.b,
        metric=cast(StepMetric, row.metric),
        kind="regression" if is_regression(row) else "improvement",
        before=row.before_value,
        after=row.after_value,
        change_pct=round(100 * row.change, 3),
        noise_pct=round(100 * row.noise, 3),
        min_detectable_change_pct=(
            round(100 * detectable_change(row.noise, row.runs_before, row.runs_after), 3)
            if row.metric not in (KNEE_METRIC, OUTPUTS_METRIC)
            else None
        ),
        confidence=row.confidence,
        runs_before=row.runs_before,
        runs_after=row.runs_after,
        cause=row.cause,
        cause_kinds=row.cause_kinds,
        before_build=row.before_build,
        after_build=row.after_build,
        first_run_id=row.first_run_id,
        first_seen_at=row.first_seen_at,
        detected_at=row.detected_at,
        acknowledged_at=row.acknowledged_at,
        acknowledged_by=row.acknowledged_by,
        note=row.note,
    )


class CurvePointPublic(BaseModel):
    b: int
    total_tps: float = Field(description="S_TG")
    per_user_tps: float = Field(description="S_TG / B")
    ms_per_token: float | None = Field(
        description="what one user waits per token: 1000 B / S_TG (None when S_TG is 0)"
    )
    prefill_tps: float | None = Field(description="S_PP")
    past_knee: bool
    mbu: float | None = Field(
        description="memory-bandwidth utilisation: S_TG / B x the bytes a decode step reads "
        "/ the node's peak bandwidth (docs/design/bandwidth.md; None: the model's facts or "
        "the node's bandwidth are unknown)"
    )
    tokens_per_joule: float | None = Field(
        default=None,
        description="generated tokens (B x TG) per joule the counted devices drew over the "
        "point, prefill included (the curve's `energy` says which devices; None: not counted, "
        "or `energy_invalid` says why)",
    )
    joules_per_token: float | None = Field(default=None, description="1 / tokens_per_joule")
    energy_invalid: str | None = Field(
        default=None, description="why the counter gave this point no figure"
    )
    usd_per_million_tokens: float | None = Field(
        default=None,
        description="what a million output tokens cost at this B: the class's price per hour "
        "/ (S_TG x 3600) x 10^6 (None: no price for its class)",
    )


class CurvePublic(BaseModel):
    label: str = Field(description="the engine build")
    build_number: int | None
    commit: str | None
    backend: str | None
    binding_version: str | None
    run_id: UUID
    measured_at: datetime
    pp: int
    tg: int
    knee: int | None = Field(description="the largest B before the gains per stream fade")
    bandwidth: wire.MemoryBandwidth | None = Field(
        description="the peak memory bandwidth its MBU is held against, and its source"
    )
    energy: wire.RunEnergy | None = Field(
        default=None, description="what counted its points' joules (None: nothing did)"
    )
    hardware_class: str | None = Field(
        default=None, description="its run's hardware class (None: no fingerprint)"
    )
    usd_per_hour: float | None = Field(
        default=None, description="its class's price per hour (GET /v1/prices; None: unpriced)"
    )
    points: list[CurvePointPublic]


class ServingCurvePointPublic(BaseModel):
    concurrency: int
    total_tps: float | None
    per_user_tps_p10: float | None
    per_user_tps_p50: float | None
    ttft_ms_p90: float | None
    itl_ms_p50: float | None
    of_offline_pct: float | None = Field(
        description="the server's total output tokens/s as % of the engine's S_TG at this "
        "B in the latest offline curve of the same prompt and output lengths (None: none)"
    )


class ServingCurvePublic(BaseModel):
    """The node's latest serving run of the model: what its server delivered."""

    run_id: UUID
    measured_at: datetime
    server: wire.ServerIdentity
    knee: int | None = Field(description="as for offline curves, on total output tokens/s")
    offline_run_id: UUID | None = Field(description="the offline run it is compared with")
    points: list[ServingCurvePointPublic]


class CurvesPublic(BaseModel):
    node: str
    model: str
    knee_threshold: float
    curves: list[CurvePublic] = Field(description="the latest run of each build, oldest first")
    serving: ServingCurvePublic | None = Field(
        default=None, description="the latest serving run, beside the engine's curves"
    )


class SeriesPointPublic(BaseModel):
    run_id: UUID
    started_at: datetime
    value: float
    build: str | None = Field(description="the llama.cpp build")
    binding: str | None = Field(description="what ran llama.cpp, with its version")
    fingerprint: str | None = Field(description="the hardware, described, and its hash")
    change: str | None = Field(description="what changed since the previous run")


class SeriesPublic(SeriesKey):
    points: list[SeriesPointPublic]
    regressions: list[RegressionPublic]
    min_detectable_change_pct: float | None = Field(
        default=None,
        description="the smallest lasting step at a new build that the regression check finds "
        "in this series with 95% probability, from its own run-to-run noise and its runs per "
        "build, % (null: fewer than 3 runs)",
    )
