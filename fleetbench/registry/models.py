"""The registry's tables (SQLAlchemy 2). The schema is created and changed only by the
Alembic migrations in migrations/, which are generated from this metadata."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    SQLColumnExpression,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    and_,
    or_,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "POINT_POSSIBLE",
    "RUN_NEWEST_FIRST",
    "RUN_SERVED",
    "RUN_SUCCESSFUL",
    "Base",
    "BuildPointSum",
    "BuildSumsStamp",
    "DetectableChange",
    "EngineBuild",
    "FailedPoint",
    "HardwareFingerprint",
    "HardwarePrice",
    "LatestPoint",
    "LatestRun",
    "LatestServingRun",
    "Model",
    "ModelFacts",
    "Node",
    "NodeActivity",
    "NodePlanStatus",
    "Regression",
    "RolloutWatch",
    "Run",
    "RunOrder",
    "RunPoint",
    "SeriesCheck",
    "ServingPointRow",
    "SweepPlan",
    "Token",
    "TokenEpoch",
    "WebhookOutbox",
    "newer_run",
    "successful_offline",
    "table_of",
]

# SQLite only autoincrements INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit key.
_BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Moments stored in UTC and read back zoned, on every database: PostgreSQL keeps the
    zone itself, SQLite keeps text without one (and would compare wall-clock strings)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON,
        float: Double(),
    }


def table_of(model: type[Base]) -> Table:
    """A model's table, for Core statements (no ORM objects: registry.ingest)."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime]


class HardwarePrice(Base):
    """What an hour of a hardware class costs, as an admin set it (`PUT /v1/prices`): one
    price per class, which a team keeps current more easily than one per node. Placement
    prices each candidate's tokens by it."""

    __tablename__ = "hardware_prices"

    hardware_class: Mapped[str] = mapped_column(String(300), primary_key=True)
    usd_per_hour: Mapped[float]
    set_at: Mapped[datetime]
    set_by: Mapped[str | None] = mapped_column(String(200))  # the admin token's name


class Token(Base):
    """A bearer token, stored as its SHA-256: tokens are 256-bit random strings, so a fast
    hash is enough (nothing to brute-force) and lookups stay one index probe. Its scope
    (registry.tokens): `node` reports that node's runs, `reader` reads everything, `admin`
    also manages tokens and acknowledges regressions. Revoked or past `expires_at`, it no
    longer authenticates; the row stays, for the list."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(200))
    node_id: Mapped[int | None] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), index=True
    )
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    # the token a rotation made in its place: a token is rotated once
    replaced_by_id: Mapped[int | None] = mapped_column(ForeignKey("tokens.id"))

    node: Mapped[Node | None] = relationship(foreign_keys=[node_id])


class TokenEpoch(Base):
    """One row, raised by every revoke and rotation in the same transaction: each registry
    process reads it four times a second and forgets the tokens it found valid when it
    moved (registry.authentication)."""

    __tablename__ = "token_epoch"

    id: Mapped[int] = mapped_column(primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger)


class HardwareFingerprint(Base):
    """One hardware identity a node has had; a new GPU or driver gives a new row."""

    __tablename__ = "hardware_fingerprints"
    __table_args__ = (UniqueConstraint("node_id", "hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    hash: Mapped[str] = mapped_column(String(128))
    data: Mapped[dict[str, Any]]
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    # Read from `data` at ingest (registry.hardware) so that placement's fit check
    # and the fleet overview never parse fingerprints.
    description: Mapped[str | None] = mapped_column(String(300))
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_kind: Mapped[str | None] = mapped_column(String(16))
    # The description without its driver (hardware.hardware_class): what a build
    # comparison groups nodes by, in SQL.
    hardware_class: Mapped[str | None] = mapped_column(String(300))


class CreatedByNode:
    """A row a node's report makes: the node is kept, and it makes at most so many of each
    kind (FLEETBENCH_MAX_ROWS_PER_NODE, registry.ingest.rows)."""

    created_by_node_id: Mapped[int | None] = mapped_column(
        ForeignKey("nodes.id", ondelete="SET NULL"), index=True
    )


class EngineBuild(CreatedByNode, Base):
    """An engine build; `identity` is a digest of all its fields, so equal builds share a row
    even where fields are NULL (which a plain unique constraint would not deduplicate)."""

    __tablename__ = "engine_builds"

    id: Mapped[int] = mapped_column(primary_key=True)
    identity: Mapped[str] = mapped_column(String(64), unique=True)
    engine: Mapped[str] = mapped_column(String(200))
    build_number: Mapped[int | None]
    commit: Mapped[str | None] = mapped_column(String(64))
    backend: Mapped[str | None] = mapped_column(String(64))
    binding: Mapped[str | None] = mapped_column(String(100))
    binding_version: Mapped[str | None] = mapped_column(String(100))


class Model(CreatedByNode, Base):
    """A model as reports name it. `identity` is `sha256:<hex>:<name_key>` when the file's
    digest is known, else `name:<name_key>`; `name_key` is the display name lowercased
    without `.gguf`. The name is part of a digest's identity: a node naming a file cannot
    rename another node's runs of it (one file under two names is two models)."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(primary_key=True)
    identity: Mapped[str] = mapped_column(String(300), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    name_key: Mapped[str] = mapped_column(String(200), index=True)
    sha256: Mapped[str | None] = mapped_column(String(64), index=True)


class ModelFacts(CreatedByNode, Base):
    """A model's file and architecture facts as one or more nodes reported them; `identity`
    is a digest of all of them. Nodes that disagree (a file edited under one name, a node
    that read it wrongly) each keep their own: a run names the facts it came with, and
    placement checks a node's fit against its own (registry.placement), never against the
    facts another node reported first."""

    __tablename__ = "model_facts"
    __table_args__ = (UniqueConstraint("model_id", "identity"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    identity: Mapped[str] = mapped_column(String(64))
    quantization: Mapped[str | None] = mapped_column(String(64))
    n_params: Mapped[int | None] = mapped_column(BigInteger)
    file_size: Mapped[int | None] = mapped_column(BigInteger)
    n_layer: Mapped[int | None]
    n_head_kv: Mapped[int | None]
    head_dim_k: Mapped[int | None]
    head_dim_v: Mapped[int | None]
    n_ctx_train: Mapped[int | None]
    sliding_window: Mapped[int | None]
    n_swa_layers: Mapped[int | None]
    # What a decode step reads (contract.bandwidth): the weights read whole, the routed
    # experts, how many there are and how many a token uses
    weight_bytes: Mapped[int | None] = mapped_column(BigInteger)
    expert_bytes: Mapped[int | None] = mapped_column(BigInteger)
    expert_count: Mapped[int | None]
    expert_used_count: Mapped[int | None]
    # wire.KvLayers, where the model's layers differ (NULL: they are alike, or not stated)
    layers: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_model_started", "model_id", "started_at"),
        # The fleet overview takes each node's latest run of any model.
        Index("ix_runs_node_started", "node_id", "started_at"),
        # Run ids are the node's own: another node's run with the same id takes nothing.
        UniqueConstraint("node_id", "reported_id"),
    )

    # The registry's id: the reported one, unless another node's run already had it.
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    reported_id: Mapped[uuid.UUID]
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    fingerprint_id: Mapped[int | None] = mapped_column(ForeignKey("hardware_fingerprints.id"))
    build_id: Mapped[int] = mapped_column(ForeignKey("engine_builds.id"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    facts_id: Mapped[int | None] = mapped_column(ForeignKey("model_facts.id"))
    source: Mapped[str] = mapped_column(String(32))
    # what made the report (wire.AgentIdentity): "fleetbench-agent 0.1.0"; NULL: it did not say
    agent: Mapped[str | None] = mapped_column(String(512))
    # offline: the engine's table (run_points); serving: a server's (serving_points)
    kind: Mapped[str] = mapped_column(String(16), default="offline", server_default="offline")
    server: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    slo_search: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # wire.SloSearch
    # Whether it measured the node's accelerator (contract.accelerator; NULL: the node has
    # none, or what the engine ran on is not known), and why not.
    engine_on_accelerator: Mapped[bool | None]
    accelerator_note: Mapped[str | None] = mapped_column(Text)
    # What llama.cpp allocated (wire.AllocatedBuffer list), and the KV cache predicted and
    # allocated in all: contract.allocation
    buffers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    kv_predicted_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    device_memory: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # DeviceMemoryUse
    # The peak memory bandwidth its points are held against (wire.MemoryBandwidth, from its
    # fingerprint: contract.bandwidth.node_bandwidth); NULL: unknown
    bandwidth: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # What else used the node while it ran (wire.Contention), and why it counts as measured
    # under contention (NULL: it does not): such a run joins no curve, series or compare
    contention: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    contention_reason: Mapped[str | None] = mapped_column(Text)
    # Where its points' joules come from and what they cover (contract.energy.RunEnergy);
    # NULL: the node counted none
    energy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The model's outputs on the reference text (contract.outputs.OutputFingerprint), as sent:
    # ~44 KB, loaded only where asked for (a run's detail), never with lists of runs
    outputs: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(index=True)
    finished_at: Mapped[datetime | None]
    received_at: Mapped[datetime]
    # SHA-256 of the validated report: a retry with the same body matches it exactly.
    report_sha256: Mapped[str] = mapped_column(String(64))

    n_ctx: Mapped[int | None]
    n_batch: Mapped[int | None]
    n_ubatch: Mapped[int | None]
    flash_attn: Mapped[str | None] = mapped_column(String(8))
    kv_unified: Mapped[bool | None]
    pp_shared: Mapped[bool | None]
    tg_separate: Mapped[bool | None]
    n_gpu_layers: Mapped[int | None]
    n_threads: Mapped[int | None]
    n_threads_batch: Mapped[int | None]
    cache_type_k: Mapped[str | None] = mapped_column(String(16))
    cache_type_v: Mapped[str | None] = mapped_column(String(16))
    swa_full: Mapped[bool | None]

    node: Mapped[Node] = relationship()
    build: Mapped[EngineBuild] = relationship()
    model: Mapped[Model] = relationship()
    fingerprint: Mapped[HardwareFingerprint | None] = relationship()
    points: Mapped[list[RunPoint]] = relationship(
        order_by="RunPoint.id", cascade="all, delete-orphan", passive_deletes=True
    )
    failures: Mapped[list[FailedPoint]] = relationship(
        order_by="FailedPoint.id", cascade="all, delete-orphan", passive_deletes=True
    )
    serving_points: Mapped[list[ServingPointRow]] = relationship(
        order_by="ServingPointRow.concurrency", cascade="all, delete-orphan", passive_deletes=True
    )


# How a node's runs are ordered newest first everywhere (ties: the later received, then id),
# and which runs have an offline curve to offer (the series, curves and history read them).
RUN_NEWEST_FIRST = (Run.started_at.desc(), Run.received_at.desc(), Run.id)
# A node's model's runs in that order: placement, the curves and the regression judge read
# its newest runs with a LIMIT, one probe whatever the history holds.
Index("ix_runs_node_model_newest", Run.node_id, Run.model_id, *RUN_NEWEST_FIRST)
# ... measured on a node nothing else was using (a contended run is kept, and shown, alone)


def successful_offline(run: Any) -> ColumnElement[bool]:
    """RUN_SUCCESSFUL of `run`: the runs table, or an alias of it."""
    return and_(run.status != "failed", run.kind == "offline", run.contention_reason.is_(None))


RUN_SUCCESSFUL = successful_offline(Run)
RUN_SERVED = and_(  # ... a serving curve
    Run.status != "failed", Run.kind == "serving", Run.contention_reason.is_(None)
)

RunOrder = tuple[SQLColumnExpression[Any], SQLColumnExpression[Any], SQLColumnExpression[Any]]
"""A run's (started_at, received_at, id) columns, wherever a table keeps them."""


def newer_run(run: RunOrder, than: RunOrder) -> ColumnElement[bool]:
    """SQL: `run` comes before `than` in RUN_NEWEST_FIRST's order (the one rule for which of
    two runs is a node's latest, used wherever a table keeps the latest)."""
    (started, received, run_id), (other_started, other_received, other_id) = run, than
    return or_(
        started > other_started,
        and_(started == other_started, received > other_received),
        and_(started == other_started, received == other_received, run_id < other_id),
    )


class RunPoint(Base):
    """One measured row of the batched-bench table."""

    __tablename__ = "run_points"

    id: Mapped[int] = mapped_column(_BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    pp: Mapped[int]
    tg: Mapped[int]
    b: Mapped[int]
    n_kv: Mapped[int | None]
    t_pp: Mapped[float | None]
    s_pp: Mapped[float | None]
    t_tg: Mapped[float | None]
    s_tg: Mapped[float | None]
    t: Mapped[float | None]
    s: Mapped[float | None]
    repeats: Mapped[int]
    s_pp_stdev: Mapped[float | None]
    s_tg_stdev: Mapped[float | None]
    # Its memory-bandwidth utilisation against the run's bandwidth (contract.bandwidth), and
    # why it cannot be true where it is above the limit: such a point joins no curve
    mbu: Mapped[float | None]
    impossible: Mapped[str | None] = mapped_column(Text)
    # What the point cost in energy, as sent (contract.energy.PointEnergy: its joules, or
    # why the counter gave none); NULL where the node counted nothing
    energy: Mapped[dict[str, Any] | None] = mapped_column(JSON)


# A point that could be true: not above its node's bandwidth (contract.bandwidth)
POINT_POSSIBLE = RunPoint.impossible.is_(None)


class ServingPointRow(Base):
    """One concurrency of a serving run (contract.wire.ServingPoint, its fields as columns)."""

    __tablename__ = "serving_points"

    id: Mapped[int] = mapped_column(_BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    concurrency: Mapped[int]
    requests: Mapped[int]
    completed: Mapped[int]
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    seconds: Mapped[float]
    total_tps: Mapped[float | None]
    per_user_tps_p10: Mapped[float | None]
    per_user_tps_p50: Mapped[float | None]
    per_user_tps_p90: Mapped[float | None]
    ttft_ms_p50: Mapped[float | None]
    ttft_ms_p90: Mapped[float | None]
    ttft_ms_p99: Mapped[float | None]
    itl_ms_p50: Mapped[float | None]
    itl_ms_p90: Mapped[float | None]
    itl_ms_p99: Mapped[float | None]
    e2e_ms_p50: Mapped[float | None]
    e2e_ms_p90: Mapped[float | None]
    e2e_ms_p99: Mapped[float | None]
    errors: Mapped[dict[str, Any]]


class FailedPoint(Base):
    __tablename__ = "failed_points"

    id: Mapped[int] = mapped_column(_BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    pp: Mapped[int]
    tg: Mapped[int]
    b: Mapped[int]
    reason: Mapped[str] = mapped_column(Text)


class WebhookOutbox:
    """The columns of a table whose rows are webhook events (registry.notify): a row due
    and `notified_at` NULL is not yet delivered; `notify_after` holds a process's lease,
    then the next retry."""

    notified_at: Mapped[datetime | None]
    notify_attempts: Mapped[int] = mapped_column(default=0)
    notify_after: Mapped[datetime | None]
    notify_error: Mapped[str | None] = mapped_column(Text)


class Regression(WebhookOutbox, Base):
    """A lasting step in one series (node x model x PP x TG x B x metric), found by the
    regression judge (registry.regressions); `first_run_id` is the first run after the
    step. `notified_at` NULL with a webhook configured: not yet delivered (the outbox)."""

    __tablename__ = "regressions"
    __table_args__ = (
        UniqueConstraint("node_id", "model_id", "pp", "tg", "b", "metric", "first_run_id"),
        Index("ix_regressions_first_seen", "first_seen_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    pp: Mapped[int]
    tg: Mapped[int]
    b: Mapped[int]
    metric: Mapped[str] = mapped_column(String(8))
    before_value: Mapped[float]
    after_value: Mapped[float]
    change: Mapped[float]
    noise: Mapped[float]
    confidence: Mapped[float]
    runs_before: Mapped[int]
    runs_after: Mapped[int]
    cause: Mapped[str] = mapped_column(Text)
    cause_kinds: Mapped[list[str]] = mapped_column(JSON)
    before_build: Mapped[str | None] = mapped_column(String(300))
    after_build: Mapped[str | None] = mapped_column(String(300))
    before_run_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), index=True
    )
    first_run_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), index=True
    )
    first_seen_at: Mapped[datetime]
    detected_at: Mapped[datetime]
    acknowledged_at: Mapped[datetime | None]
    acknowledged_by: Mapped[str | None] = mapped_column(String(200))
    note: Mapped[str | None] = mapped_column(Text)

    node: Mapped[Node] = relationship()
    model: Mapped[Model] = relationship()


class RolloutWatch(WebhookOutbox, Base):
    """A rollout an admin watches (registry.compare.rollouts): two builds of a model compared as
    GET /v1/compare compares them, the verdict checked again whenever the model has new
    runs. A change of verdict (`changed_at`) is a webhook event until delivered."""

    __tablename__ = "rollout_watches"
    __table_args__ = (UniqueConstraint("model", "from_build", "to_build", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    from_build: Mapped[str] = mapped_column(String(200))
    to_build: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    created_by: Mapped[str | None] = mapped_column(String(200))
    verdict: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    previous_verdict: Mapped[str | None] = mapped_column(String(16))
    checked_at: Mapped[datetime]
    changed_at: Mapped[datetime | None]


class LatestRun(Base):
    """Each node's latest successful run of each model (latest as RUN_NEWEST_FIRST orders
    them), kept by ingest in the same transaction as the run: what placement, /metrics and
    the fleet's gauges read, so that they never search the runs for it. With it, what the
    KV-cache fit check needs from that run and its fingerprint."""

    __tablename__ = "latest_runs"

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    run_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), unique=True
    )
    started_at: Mapped[datetime]
    received_at: Mapped[datetime]
    build_id: Mapped[int] = mapped_column(ForeignKey("engine_builds.id"))
    facts_id: Mapped[int | None] = mapped_column(ForeignKey("model_facts.id"))
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cache_type_k: Mapped[str | None] = mapped_column(String(16))
    cache_type_v: Mapped[str | None] = mapped_column(String(16))
    n_ubatch: Mapped[int | None]
    flash_attn: Mapped[str | None] = mapped_column(String(8))
    swa_full: Mapped[bool | None]
    engine_on_accelerator: Mapped[bool | None]  # the run's
    # weights, compute and outputs as the run's llama.cpp allocated them (None: not logged)
    beside_kv_bytes: Mapped[int | None] = mapped_column(BigInteger)


class LatestPoint(Base):
    """A point of a LatestRun, with whether it lies past the knee of its (PP, TG) curve at
    the default threshold (NULL: the curve has no knee, or the point no S_TG)."""

    __tablename__ = "latest_points"
    __table_args__ = (
        ForeignKeyConstraint(
            ["node_id", "model_id"],
            ["latest_runs.node_id", "latest_runs.model_id"],
            ondelete="CASCADE",
        ),
        # Placement reads one model's points across the fleet.
        Index("ix_latest_points_model_node", "model_id", "node_id", "pp"),
    )

    node_id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(primary_key=True)
    pp: Mapped[int] = mapped_column(primary_key=True)
    tg: Mapped[int] = mapped_column(primary_key=True)
    b: Mapped[int] = mapped_column(primary_key=True)
    s_pp: Mapped[float | None]
    s_tg: Mapped[float | None]
    mbu: Mapped[float | None]
    joules: Mapped[float | None]
    past_knee: Mapped[bool | None]


class DetectableChange(Base):
    """The smallest S_TG step each of a node's series shows with 95% probability at a new
    build (regressions.rules.min_detectable_change), as of the series' latest check:
    written by the regression judge alone (registry.regressions), read beside the latest
    points by placement; a point without a row is unknown."""

    __tablename__ = "detectable_changes"

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    pp: Mapped[int] = mapped_column(primary_key=True)
    tg: Mapped[int] = mapped_column(primary_key=True)
    b: Mapped[int] = mapped_column(primary_key=True)
    change: Mapped[float]


class LatestServingRun(Base):
    """Each node's latest successful serving run of each model (as RUN_NEWEST_FIRST orders
    them), kept by ingest in the run's transaction beside LatestRun: what placement reads
    of the servers the fleet runs (their points are the run's serving_points), with the
    server's prompt and output lengths and slots."""

    __tablename__ = "latest_serving_runs"

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    run_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), unique=True
    )
    started_at: Mapped[datetime]
    received_at: Mapped[datetime]
    build_id: Mapped[int] = mapped_column(ForeignKey("engine_builds.id"))
    prompt_tokens: Mapped[int]
    gen_tokens: Mapped[int]
    slots: Mapped[int | None]
    ctx_per_slot: Mapped[int | None]


class ModelBuildNodeKey:
    """The key columns first in a table kept per node's runs of a model with one build."""

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True, sort_order=-1
    )
    build_id: Mapped[int] = mapped_column(
        ForeignKey("engine_builds.id"), primary_key=True, sort_order=-1
    )
    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True, sort_order=-1
    )


class BuildPointSum(ModelBuildNodeKey, Base):
    """A node's successful runs of a model with one build, on one hardware and settings,
    summed per point and metric: kept by ingest in the runs' transaction, and by the prune
    as it deletes runs (registry.projections.build_sums), so that a build comparison reads one row
    per node, build and point, whatever the history."""

    __tablename__ = "build_point_sums"

    # 0: runs without a fingerprint (a key column is never NULL); fingerprints go with
    # their node, whose rows here go too
    fingerprint_id: Mapped[int] = mapped_column(primary_key=True)
    settings: Mapped[str] = mapped_column(String(400), primary_key=True)
    metric: Mapped[str] = mapped_column(String(24), primary_key=True)
    pp: Mapped[int] = mapped_column(primary_key=True)
    tg: Mapped[int] = mapped_column(primary_key=True)
    b: Mapped[int] = mapped_column(primary_key=True)
    runs: Mapped[int]
    total: Mapped[float]
    squares: Mapped[float]
    # over the runs whose point has repeats: their stdev relative to the value, and repeats
    relative_sd: Mapped[float]
    repeats: Mapped[float]
    repeated: Mapped[int]


class BuildSumsStamp(ModelBuildNodeKey, Base):
    """When a node's sums of a model's build last changed, and how many times they have:
    written with them (registry.projections.build_sums), so that a process keeping an
    answer read from a build's sums (registry.compare.answer) knows them unchanged by
    reading a row per node, not per point."""

    __tablename__ = "build_sums_stamps"

    version: Mapped[int]
    changed_at: Mapped[datetime]


class NodeActivity(Base):
    """Each node's newest offline run (of any model, failed ones too: a node whose latest
    run failed is failing) and how many runs it has, kept by ingest: what the fleet overview
    reads per node, so that listing nodes never searches or counts their runs."""

    __tablename__ = "node_activity"

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    last_run_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), index=True
    )
    last_run_started_at: Mapped[datetime | None]
    last_run_received_at: Mapped[datetime | None]
    run_count: Mapped[int] = mapped_column(default=0)


class SeriesCheck(Base):
    """A (node, model)'s series with runs the regression check has not judged yet: queued
    by ingest in the runs' own transaction, taken by a registry process's judge
    (registry.regressions) once `queued_at` is `FLEETBENCH_REGRESSION_CHECK_DELAY_S` old,
    and deleted when judged. However many runs arrive meanwhile, the series is judged once:
    the check's cost is per series change, not per report."""

    __tablename__ = "series_checks"
    __table_args__ = (Index("ix_series_checks_queued", "queued_at"),)

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # offline or serving
    # The earliest start of the runs not judged yet (None: none since a judge claimed it).
    since: Mapped[datetime | None]
    # When the first run not judged yet arrived (later ones leave it): when it is due.
    queued_at: Mapped[datetime]
    # A judge's lease, and the runs it judges: until then another process leaves the
    # check alone; after it, a judge takes these runs with those queued since.
    claimed_until: Mapped[datetime | None]
    claimed_since: Mapped[datetime | None]


class SweepPlan(Base):
    """One version of a sweep plan (fleetbench.contract.plans): every change an admin makes
    is a new row, so each is kept; a plan's current version is its highest. `body` is the
    PlanBody as validated."""

    __tablename__ = "sweep_plans"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int]
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    created_by: Mapped[str | None] = mapped_column(String(200))


class NodePlanStatus(Base):
    """What a node last said of its plans (contract.plans.NodeStatus, in `status`), and an
    admin's request that it sweep now, until it says it did."""

    __tablename__ = "node_plan_status"

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    reported_at: Mapped[datetime | None]
    status: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    next_run_at: Mapped[datetime | None]
    sweep_requested_at: Mapped[datetime | None]
