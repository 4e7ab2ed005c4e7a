"""The registry's answers that agents read: the receipt for a stored run, the placement and
capacity answers, the build comparison, the regressions. Part of the contract both sides share
(fleetbench.contract), so the agent parses exactly what the registry declares in its OpenAPI
schema."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, Field

from fleetbench.contract.bounds import Moment

__all__ = [
    "BLIND_ABOVE_PCT",
    "COMPARE_METRIC_NAMES",
    "CapacityAnswer",
    "CapacityClass",
    "CapacityMinimise",
    "CapacityNode",
    "CapacityRefusal",
    "ClassOutputs",
    "ClassPoint",
    "ClassSummary",
    "CompareAnswer",
    "CompareKind",
    "CompareVerdict",
    "FactsSource",
    "FitBasis",
    "Metric",
    "NodeCompared",
    "NotCompared",
    "PlacementAnswer",
    "PlacementCandidate",
    "PlacementKind",
    "PlacementOrder",
    "PointRatio",
    "RegressionPublic",
    "RegressionsPublic",
    "RejectedConcurrency",
    "RunReceipt",
    "SeriesKey",
    "StepMetric",
]

FactsSource = Literal["node", "most nodes", "none"]
PlacementKind = Literal["offline", "serving", "any"]
PlacementOrder = Literal["throughput", "cost"]
FitBasis = Literal["measured buffers", "predicted only", "server slots"]
# A candidate whose series cannot show a slowdown this large (with 95% probability) is
# called out: a regression of this size on its node would go unseen.
BLIND_ABOVE_PCT = 10.0
CompareKind = Literal["offline", "serving"]
# A series' metric: an offline run's decode or prefill speed, a serving run's throughput;
# what a regression is of: one of those, or the knee of a PP x TG's curves.
Metric = Literal["s_tg", "s_pp", "srv_tps"]
StepMetric = Literal[Metric, "knee", "outputs"]
CompareVerdict = Literal["go", "hold", "unknown"]
# The metrics a build comparison weighs, as its tables and reasons name them.
COMPARE_METRIC_NAMES = {
    "s_tg": "S_TG",
    "s_pp": "S_PP",
    "per_user_tps_p10": "per-user p10",
    "ttft_ms_p90": "TTFT p90",
    "joules_per_token": "energy per token",
}


class RunReceipt(BaseModel):
    """The registry's answer to a stored report (201 created, 200 for a retry)."""

    run_id: UUID = Field(description="the run id as reported (a node's run ids are its own)")
    stored_as: UUID | None = Field(
        default=None,
        description="the registry's id of the run (/v1/runs/{id}): the reported one unless "
        "another node's run already had it",
    )
    outcome: Literal["created", "already stored"]
    points: int
    failures: int
    ignored_fields: list[str] = Field(
        default_factory=list,
        description="fields of the report this registry does not know (a newer agent's), "
        "left out: `settings.new_knob`, `points[].new_figure`",
    )


class PlacementCandidate(BaseModel):
    """A node and the largest concurrency at which it meets the per-user speed asked for
    (and the time to first token, when one is asked for), from the engine's offline curve or
    from the server's serving run (`source`)."""

    node: str
    concurrency: int
    per_user_tps: float = Field(
        description="offline: S_TG / B at that concurrency; serving: the p10 of the users' "
        "decode speeds (nine users in ten got more)"
    )
    total_tps: float = Field(
        description="offline: S_TG, total decode tokens/s; serving: output tokens/s served"
    )
    prefill_tps: float | None = Field(description="S_PP at that point (offline)")
    prompt_tokens: int = Field(description="PP of the point (serving: the prompt length)")
    gen_tokens: int = Field(description="TG of the point (serving: the output length)")
    llama_cpp_build: int | None
    measured_at: Moment
    run_id: UUID
    past_knee: bool | None = Field(
        default=None, description="the concurrency lies past the node's knee (None: unknown)"
    )
    mbu: float | None = Field(
        default=None,
        description="offline: the point's memory-bandwidth utilisation, S_TG / B x the bytes "
        "a decode step reads / the node's peak bandwidth (None: unknown)",
    )
    hardware_class: str | None = Field(
        default=None, description="its run's hardware class (None: its run has no fingerprint)"
    )
    usd_per_hour: float | None = Field(
        default=None, description="its class's price per hour as an admin set it (GET /v1/prices)"
    )
    usd_per_million_tokens: float | None = Field(
        default=None,
        description="what a million output tokens cost at this concurrency: usd_per_hour / "
        "(total_tps x 3600) x 10^6 (None: no price for its class)",
    )
    tokens_per_joule: float | None = Field(
        default=None,
        description="offline: the point's generated tokens per joule its counted devices "
        "drew, prefill included (None: not measured, or the counter was invalid)",
    )
    energy_source: str | None = Field(
        default=None, description="what counted the joules: nvml, amdsmi, rapl (GET /v1/runs)"
    )
    kv_cache_gib: float | None = Field(
        default=None,
        description="KV cache of all users at this concurrency, at context_tokens each "
        "(or the point's own PP + TG); None without the model's architecture numbers",
    )
    kv_rules: str | None = Field(
        default=None,
        description="which of llama.cpp's rules predicted kv_cache_gib, for which build (the "
        "node's latest run's), or 'fit unknown: <why>' where the maths cannot say",
    )
    fit: Literal["fits", "not checked"] = Field(
        default="not checked", description="whether weights + KV cache were checked to fit"
    )
    min_detectable_change_pct: float | None = Field(
        default=None,
        description="offline: the smallest lasting S_TG step at a new build that the "
        "regression check finds in this point's series with 95% probability, % (null: not "
        f"known yet); above {BLIND_ABOVE_PCT:g} the reason says the node's slowdowns may go "
        "unseen",
    )
    fit_basis: FitBasis | None = Field(
        default=None,
        description="what a checked fit added to the predicted KV cache: the weights, compute "
        "and output buffers llama.cpp allocated in the node's latest run (measured buffers), "
        "or the model file's size alone (predicted only, when that run logged no buffers); "
        "server slots: the serving run's server holds the context in each slot",
    )
    facts_from: FactsSource = Field(
        default="none",
        description="whose model facts (file size, architecture) the KV cache and the fit "
        "were computed from: the node's own report, those most nodes' latest runs report "
        "(the node reported none), or none known",
    )
    source: Literal["offline", "serving"] = Field(
        default="offline",
        description="what backs it: the engine's curve (llama-batched-bench's table) or the "
        "node's latest serving run of the server the team runs (whose slots hold the "
        "context asked for when `fit` is fits)",
    )
    ttft_ms_p90: float | None = Field(
        default=None, description="serving: the p90 of the time to first token, ms"
    )
    server: str | None = Field(
        default=None, description="serving: the server's kind (llama-server, vllm, ...)"
    )
    slots: int | None = Field(default=None, description="serving: the server's slots")
    engine_on_accelerator: bool | None = Field(
        default=None,
        description="offline: false when the run measured the CPU of a node with a GPU (the "
        "engine built for the CPU, or no layer offloaded): its figures are not the GPU's",
    )


class RejectedConcurrency(BaseModel):
    """A concurrency that met the speed asked for but whose KV cache would not fit."""

    node: str
    concurrency: int
    kv_cache_gib: float
    reason: str


class PlacementAnswer(BaseModel):
    """Which node and concurrency meets `min_tps_per_user` for `model`."""

    model: str
    min_tps_per_user: float
    kind: PlacementKind = Field(
        default="any",
        description="what backs the candidates: offline curves, serving runs, or any (each "
        "node's serving run of the model where it has one, else its offline curve)",
    )
    max_ttft_ms: float | None = Field(
        default=None, description="the p90 time to first token asked for (serving runs)"
    )
    context_tokens: int | None = None
    order: PlacementOrder = Field(
        default="throughput",
        description="how candidates are listed: best total throughput first, or the cheapest "
        "per million tokens first (candidates without a price last)",
    )
    count: int = Field(description="how many nodes qualify; `candidates` lists the first `limit`")
    candidates: list[PlacementCandidate] = Field(description="in `order`")
    rejected: list[RejectedConcurrency] = Field(
        default_factory=list, description="faster choices refused because they would not fit"
    )
    reason: str


# What a capacity plan minimises: the nodes it takes, or what they cost an hour.
CapacityMinimise = Literal["nodes", "cost"]


class CapacityNode(BaseModel):
    """A node of a capacity plan and what its curve serves at the speed asked for."""

    node: str
    hardware_class: str
    users: int = Field(description="concurrent users it serves: its placement concurrency")
    per_user_tps: float
    total_tps: float
    source: Literal["offline", "serving"]
    llama_cpp_build: int | None
    measured_at: Moment
    age_days: float
    run_id: UUID
    usd_per_hour: float | None = Field(
        default=None, description="its class's price per hour (null: none is set)"
    )


class CapacityClass(BaseModel):
    """How many nodes of one hardware class alone would serve the users."""

    hardware_class: str
    nodes_available: int
    nodes_needed: int | None = Field(description="null: the class's nodes are not enough")
    users_served: int = Field(description="by the nodes needed (or all of the class's)")
    total_tps: float
    usd_per_hour: float | None = Field(
        default=None,
        description="the nodes needed times the class's price per hour (null: not enough, "
        "or no price for the class)",
    )
    usd_per_million_tokens: float | None = Field(
        default=None, description="usd_per_hour / (total_tps x 3600) x 10^6"
    )


class CapacityRefusal(BaseModel):
    node: str
    reason: str


class CapacityAnswer(BaseModel):
    """How many of which nodes serve `users` concurrent users of `model`, each at
    `min_tps_per_user` or more, from each node's measured curve."""

    model: str
    users: int
    min_tps_per_user: float
    context_tokens: int | None
    max_ttft_ms: float | None
    kind: PlacementKind
    minimise: CapacityMinimise = Field(
        default="nodes",
        description="what the plan minimises: nodes, the fewest; cost, the price per hour "
        "of its nodes' classes (GET /v1/prices), nodes without a price left out",
    )
    enough: bool = Field(
        description="whether the fleet's eligible nodes (a cost plan: its priced ones) serve "
        "them all"
    )
    nodes_needed: int | None = Field(description="the plan's nodes (null: not enough)")
    plan: list[CapacityNode] = Field(
        description="the fewest nodes, or the cheapest, most users first (not enough: every "
        "eligible one)"
    )
    users_served: int
    headroom_users: int = Field(description="users the plan could take beyond those asked")
    total_tps: float = Field(description="the plan's nodes' total decode tokens/s")
    usd_per_hour: float | None = Field(
        default=None,
        description="what the plan's nodes cost an hour by their classes' prices (null: a "
        "node without a price, or no node)",
    )
    usd_per_million_tokens: float | None = Field(
        default=None, description="usd_per_hour / (total_tps x 3600) x 10^6"
    )
    exact: bool | None = Field(
        default=None,
        description="cost: whether the plan is the cheapest there is (false: planned "
        "greedily, the fleet and users too many to plan exactly); null: a nodes plan, or "
        "not enough priced nodes",
    )
    lower_bound_usd_per_hour: float | None = Field(
        default=None,
        description="cost: no plan serving the users costs less an hour: the plan's own "
        "price when exact, else the fractional plan's (the cheapest per user first, the "
        "last node in part); usd_per_hour minus it is the most a cheaper plan could save",
    )
    per_class: list[CapacityClass]
    refused: list[CapacityRefusal] = Field(
        description="nodes with a curve for the model left out, and why: reserved, stale, "
        "past the knee, off accelerator, a blind series, not even one user fits; a cost "
        "plan's: no price for the node's class"
    )
    reason: str


# The build comparison (GET /v1/compare). The models keep the docstrings they had in the
# registry: a docstring is its schema's description, and the schema must not move.


class PointRatio(BaseModel):
    """One point of one node: the new build's figure over the old one's."""

    metric: str = Field(description="s_tg, s_pp (offline); per_user_tps_p10, ttft_ms_p90")
    pp: int
    tg: int
    b: int = Field(description="B (offline) or the concurrency (serving)")
    from_value: float = Field(description="the old build's mean over its runs")
    to_value: float
    ratio: float = Field(description="to_value / from_value")
    ratio_low: float = Field(description="95% confidence interval of the ratio")
    ratio_high: float
    runs_from: int
    runs_to: int
    detectable_pct: float = Field(
        description="the smallest change these runs tell from noise with 95% probability, %"
    )
    beyond_detection: bool = Field(description="the change is at least detectable_pct")
    worse_pct: float = Field(description="how much worse the new build is, % (< 0: better)")


class NodeCompared(BaseModel):
    node: str
    hardware: str | None
    hardware_class: str | None
    settings: str = Field(description="the settings both builds ran with")
    runs_from: int
    runs_to: int
    points: list[PointRatio]


class NotCompared(BaseModel):
    node: str
    hardware_class: str | None
    reason: str


class ClassPoint(BaseModel):
    metric: str
    pp: int
    tg: int
    b: int
    nodes: int
    median_ratio: float
    worst_node: str
    worst_ratio: float
    detectable_pct: float
    worse_pct: float
    held: bool = Field(description="worse by at least detectable_pct and the minimum change")


class ClassOutputs(BaseModel):
    """What a class's model outputs on the reference text did between the builds: its worst
    node's change against the class's floor (docs/design/outputs.md)."""

    state: Literal["unchanged", "within the floor", "changed"] = Field(
        description="changed holds the rollout"
    )
    nodes: int = Field(description="nodes with both builds' outputs on one model file")
    worst_node: str
    mean_kl: float = Field(description="the worst node's mean KL divergence, nats")
    p99_kl: float
    top_token_agreement: float = Field(description="the share of positions whose top token agrees")
    floor_kl: float = Field(
        description="the largest mean KL the class shows without a new build: run to run, "
        "node to node"
    )
    floor_p99_kl: float = Field(description="the largest p99 KL it shows so")
    reason: str


class ClassSummary(BaseModel):
    hardware_class: str
    verdict: CompareVerdict
    reason: str
    nodes_compared: int
    nodes_not_compared: int = Field(description="nodes of the class that ran the new build only")
    runs_needed: int | None = Field(
        description="unknown: more runs of each build each node needs (null otherwise)"
    )
    efficiency: str | None = Field(
        default=None,
        description="where the new build costs more energy per token, beyond noise, by at "
        "least the minimum change: which point, by how much (a hold only with "
        "FLEETBENCH_COMPARE_HOLD_ON_ENERGY)",
    )
    outputs: ClassOutputs | None = Field(
        default=None, description="what its model outputs did (null: no node to compare)"
    )
    points: list[ClassPoint]


class CompareAnswer(BaseModel):
    model: str
    kind: CompareKind
    from_build: str = Field(description="as asked")
    to_build: str
    from_builds: list[str] = Field(description="the builds from_build named")
    to_builds: list[str]
    verdict: CompareVerdict = Field(
        description="go: no hardware class slower beyond what its runs tell from noise; "
        "hold: one is (the reason names it, the point and how much); unknown: too few runs "
        "(the reason says how many more)"
    )
    reason: str
    min_change_pct: float
    max_detectable_pct: float
    classes: list[ClassSummary] = Field(description="each hardware class that ran the new build")
    nodes_compared: int = Field(description="how many nodes ran both builds comparably")
    nodes: list[NodeCompared] = Field(
        description="the first `limit` of them, the one most worse at any point first"
    )
    not_compared: list[NotCompared] = Field(description="the nodes with one build only, and why")


class SeriesKey(BaseModel):
    """One series: a node's model at PP x TG x B, one metric."""

    node: str
    model: str
    pp: int
    tg: int
    b: int
    metric: Metric


class RegressionPublic(SeriesKey):
    """A lasting step in one series (`GET /v1/regressions`, `fleetbench-agent regressions`);
    `change_pct` is negative when it got slower. Metric `knee`: the knee of the PP x TG
    curve moved at a known change (B is 0; before and after are the knees: from 8 streams
    to 4 is -50%). Metric `outputs`: the model's outputs on the reference text moved from
    the run before (PP, TG and B 0; before and after the floor's and the run's mean KL
    divergence in nats, `change_pct` the share of top tokens that changed, negative or 0:
    always a regression; the figures and the cause in `cause`)."""

    metric: StepMetric  # type: ignore[assignment]  # a series' metric, a knee, or outputs

    id: int
    kind: Literal["regression", "improvement"]
    before: float = Field(
        description="mean of the runs before the step (outputs: the floor's mean KL, nats)"
    )
    after: float = Field(description="mean of the runs after it (outputs: the run's mean KL)")
    change_pct: float
    noise_pct: float = Field(description="the series' run-to-run standard deviation, %")
    min_detectable_change_pct: float | None = Field(
        description="the smallest step this series could show with 95% probability at a new "
        "build, with this noise and these runs on each side, % (null for a knee's move and "
        "for outputs)"
    )
    confidence: float = Field(description="1 - p of the step under the series' noise")
    runs_before: int
    runs_after: int
    cause: str
    cause_kinds: list[str]
    before_build: str | None
    after_build: str | None
    first_run_id: UUID
    first_seen_at: datetime
    detected_at: datetime
    acknowledged_at: datetime | None
    acknowledged_by: str | None = Field(default=None, description="the admin token's name")
    note: str | None


class RegressionsPublic(BaseModel):
    data: list[RegressionPublic]
    count: int
