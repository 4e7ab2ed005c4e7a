"""The registry's settings: one object per process, read from FLEETBENCH_* variables
(or a .env file in the working directory)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetbench.registry.compare.rules import CompareSettings

__all__ = ["RegistrySettings"]


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "fleetbench"


class RegistrySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEETBENCH_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default: a SQLite file in data_dir. "
        "PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="where the default SQLite file lives: $XDG_DATA_HOME/fleetbench "
        "(~/.local/share/fleetbench)",
    )
    max_report_bytes: int = Field(
        default=2 * 1024 * 1024,
        gt=0,
        le=1024**3,
        description="largest request body accepted (413 above); a report of the most points "
        "allowed is about 250 KB",
    )
    read_token_required: bool = Field(
        default=False, description="when true, every GET needs a reader or admin token"
    )
    auth_failures_per_minute: int = Field(
        default=60,
        ge=0,
        le=1_000_000,
        description="refused tokens one client address may send a minute before it is "
        "answered 429 (0: no limit); behind a proxy, name it in FLEETBENCH_FORWARDED_ALLOW_IPS",
    )
    stale_after_hours: float = Field(
        default=48, gt=0, description="a node with no run for this long shows as stale"
    )
    missed_after_minutes: float = Field(
        default=60,
        gt=0,
        description="a node whose next planned sweep is this late shows as missed schedule",
    )
    webhook_url: str | None = Field(
        default=None, description="POSTed a JSON body for each new regression (retried)"
    )
    webhook_max_age_days: float = Field(
        default=7, gt=0, description="regressions whose first run is older are not sent"
    )
    regression_check_delay_s: float = Field(
        default=10,
        ge=0,
        le=3600,
        description="seconds a series waits after its first new run before the regression "
        "check judges it: a node's runs arriving meanwhile are judged with it, once",
    )
    # A rollout's verdict (GET /v1/compare; registry.compare.rules).
    compare_min_change: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="a build worse than the one before by less than this fraction never "
        "holds a rollout",
    )
    compare_max_detectable: float = Field(
        default=0.10,
        gt=0,
        lt=1,
        description="a hardware class whose runs cannot tell a slowdown this large from "
        "noise gets the verdict unknown, with the runs it needs",
    )
    compare_min_runs: int = Field(
        default=2,
        ge=1,
        le=100,
        description="runs of each build a node needs before its comparison counts",
    )
    compare_outputs_min_kl: float = Field(
        default=0.01,
        gt=0,
        le=100,
        description="a build whose outputs on the reference text moved by a mean KL "
        "divergence (nats) under this, or under twice its class's floor, has changed them "
        "within the floor; above both, they changed and the rollout holds. The regression "
        "judge holds each node's runs to it too (an output shift between two runs)",
    )
    compare_hold_on_energy: bool = Field(
        default=False,
        description="a build that costs more energy per token on a hardware class (beyond "
        "noise, by at least the minimum change) holds a rollout; off, it is shown, not held",
    )
    forwarded_allow_ips: str | None = Field(
        default=None,
        description="`serve`: the proxies (addresses or networks, comma-separated; * for "
        "any) whose X-Forwarded-For and -Proto are believed; none by default, so a client "
        "address is its connection's",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="`serve`: the largest request line and headers read (431 above)",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8787",
        description="the registry's address as people reach it, for links in webhooks",
    )
    # Admission (registry.admission): what one process works on at once. Its connection
    # pool and worker threads are sized from these, so an admitted request never waits
    # for either.
    max_reads_in_flight: int = Field(
        default=8, ge=1, le=256, description="GETs one process answers at once"
    )
    max_writes_in_flight: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="reports (and other writes) one process has in hand at once; they wait "
        "for the writer threads without holding a thread or a connection",
    )
    writer_threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description="threads (and connections) per process storing reports, in batches "
        "(SQLite: always 1); more rarely help: they share the process's GIL with the reads",
    )
    writer_linger_ms: float = Field(
        default=25,
        ge=0,
        le=1000,
        description="how long a writer thread waits for more reports to store in the same "
        "transaction as the first: the fixed cost of a transaction is shared by all of "
        "them, for that much latency",
    )
    max_queued: int = Field(
        default=64, ge=0, le=100_000, description="requests per kind that may wait their turn"
    )
    max_queue_wait_s: float = Field(
        default=2.0, gt=0, le=300, description="the longest a request waits before a 503"
    )
    retry_after_s: int = Field(
        default=2, ge=1, le=3600, description="Retry-After of a 503 (the answer adds jitter)"
    )
    max_token_lookups_in_flight: int = Field(
        default=4,
        ge=1,
        le=256,
        description="tokens one process looks up in its database at once (those it has not "
        "found valid lately): a flood of unknown tokens waits in its own queue",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="the longest a request body may take to arrive (408 after); a write "
        "takes its place among the writes only once its body is in hand",
    )
    max_uploads_per_token: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="request bodies arriving at once with one token (429 beyond); an agent "
        "sends one at a time",
    )
    # Bounds per node: what one node's reports may cost the others.
    max_points_per_report: int = Field(
        default=1024, ge=1, le=100_000, description="measured plus failed points in one report"
    )
    max_series_per_node: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description="points in a node's latest curves, over all its models (what placement,"
        " /metrics and the dashboard read per node)",
    )
    max_rows_per_node: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="engine builds, models and sets of model facts a node's reports may "
        "make, each (a run that would make one more is refused)",
    )
    metrics_max_points: int = Field(
        default=50_000,
        ge=0,
        le=10_000_000,
        description="fleet points /metrics exports at most (beyond that, "
        "fleetbench_fleet_points_truncated is 1)",
    )
    retention_days: float | None = Field(
        default=None,
        gt=0,
        le=36_500,
        description="`fleetbench-registry prune`: keep every run this long, then one run per "
        "node, model and build (and the runs regressions and latest curves name)",
    )

    @property
    def pool_size(self) -> int:
        """Connections per process: one per admitted read, writer thread and token look-up,
        and a few for /healthz, the regression judge, the webhook thread, the token epoch
        and the rare writes that are not reports."""
        return self.max_reads_in_flight + self.writer_threads + self.max_token_lookups_in_flight + 5

    @property
    def worker_threads(self) -> int:
        """Threads for requests: one per admitted read and token look-up, and some for what
        else runs in threads (pages, /healthz, the rare writes that are not reports)."""
        return self.max_reads_in_flight + self.max_token_lookups_in_flight + 16

    def compare_settings(self) -> CompareSettings:
        return CompareSettings(
            min_change=self.compare_min_change,
            max_detectable=max(self.compare_max_detectable, self.compare_min_change),
            min_runs=self.compare_min_runs,
            hold_on_energy=self.compare_hold_on_energy,
            outputs_min_kl=self.compare_outputs_min_kl,
        )

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'registry.db'}"

    @property
    def is_default_sqlite(self) -> bool:
        return not self.database_url
