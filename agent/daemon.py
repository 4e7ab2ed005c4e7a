"""`fleetbench-agent daemon`: scheduled sweeps, delivered without loss, unattended.

Each configured sweep runs on its cron schedule (with random jitter, so a fleet does not
sweep in the same second), and at once when the llama.cpp build or the model file has
changed since its last successful run, so a regression after an upgrade shows the next
morning. Never two sweeps at once: one worker thread in the process, a file lock across
processes. While other work holds the CPU or GPU above a threshold the sweep is postponed,
saying why: benchmarks neither disturb production nor get polluted by it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from agent import _proc
from agent.client import RegistryClient
from agent.config import AgentSettings
from agent.errors import SpoolUnwritable
from agent.gguf_model import sha256_of
from agent.probes.nvidia import nvml_session
from agent.runners import SweepSpec
from agent.spool import Spool
from agent.sweep import measure_run
from agent.wire import RunReport

__all__ = ["ConfigError", "Daemon", "DaemonConfig", "SweepConfig", "load_config", "sweep_lock"]

log = logging.getLogger("fleetbench.daemon")

PositiveInts = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class ConfigError(ValueError):
    """The daemon's configuration cannot work; the message names the key."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SweepConfig(_Config):
    """One scheduled sweep: a model, a schedule and llama-batched-bench's settings."""

    name: str = Field(min_length=1)
    model: Path
    model_name: str | None = None
    cron: str = Field(description="crontab expression, e.g. '0 3 * * *'")
    npp: PositiveInts = [128]
    ntg: PositiveInts = [128]
    npl: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] = [1, 2, 4, 8]
    ctx_size: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=2048, ge=1)
    ubatch_size: int = Field(default=512, ge=1)
    flash_attn: Literal["on", "off", "auto"] = "auto"
    kv_unified: bool = False
    pp_shared: bool = False
    n_gpu_layers: int = -1
    threads: int | None = Field(default=None, ge=1)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    repeats: int = Field(default=3, ge=1)
    binary: Path | None = Field(
        default=None, description="the node's llama-batched-bench, instead of in-process"
    )

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, cron: str) -> str:
        from apscheduler.triggers.cron import CronTrigger

        CronTrigger.from_crontab(cron)  # raises ValueError naming the bad field
        return cron

    def spec(self) -> SweepSpec:
        return SweepSpec(
            npp=tuple(self.npp),
            ntg=tuple(self.ntg),
            npl=tuple(self.npl),
            n_ctx=self.ctx_size,
            n_batch=self.batch_size,
            n_ubatch=self.ubatch_size,
            flash_attn=self.flash_attn,
            kv_unified=self.kv_unified,
            pp_shared=self.pp_shared,
            n_gpu_layers=self.n_gpu_layers,
            n_threads=self.threads,
            cache_type_k=self.cache_type_k,
            cache_type_v=self.cache_type_v,
            repeats=self.repeats,
        )


def _engine_identity(binary: Path | None) -> dict[str, str]:
    if binary is None:
        import importlib.metadata

        return {"llama-cpp-python": importlib.metadata.version("llama-cpp-python")}
    from agent.runners import batched_bench_binary

    try:
        build = batched_bench_binary.binary_build(binary)
    except (_proc.CommandNotFound, _proc.CommandFailed):
        return {"llama-batched-bench": "missing"}
    return {"llama-batched-bench": f"{build.build_number} {build.commit} {build.backend}"}


class DaemonConfig(_Config):
    """agent.toml. FLEETBENCH_* variables override the [agent] table."""

    node: str | None = None
    registry_url: str | None = None
    token: SecretStr | None = None
    spool: Path | None = None
    jitter_s: float = Field(default=300, ge=0)
    flush_every_s: float = Field(default=60, gt=0)
    set_aside_after_5xx: int = Field(
        default=5, ge=1, description="5xx answers for one run, while others are delivered"
    )
    set_aside_after_attempts: int = Field(default=20, ge=1)
    set_aside_after_hours: float = Field(
        default=24, gt=0, description="... or failing this long and that many attempts"
    )
    check_changes_every_s: float = Field(default=3600, gt=0)
    busy_cpu_percent: float = Field(default=80, gt=0, le=100)
    busy_gpu_percent: float = Field(default=20, gt=0, le=100)
    busy_retry_s: float = Field(default=900, gt=0)
    sweeps: list[SweepConfig] = Field(default_factory=list, alias="sweep", min_length=1)

    @field_validator("sweeps")
    @classmethod
    def _unique_names(cls, sweeps: list[SweepConfig]) -> list[SweepConfig]:
        names = [s.name for s in sweeps]
        if len(set(names)) != len(names):
            raise ValueError(f"sweep names must be unique: {names}")
        return sweeps


def load_config(path: Path) -> DaemonConfig:
    """Reads agent.toml: `[agent]` settings and `[[sweep]]` tables. Raises ConfigError."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    unknown = set(raw) - {"agent", "sweep"}
    if unknown:
        raise ConfigError(
            f"{path}: unknown table(s) {sorted(unknown)}; expected [agent], [[sweep]]"
        )
    try:
        return DaemonConfig.model_validate({**raw.get("agent", {}), "sweep": raw.get("sweep", [])})
    except ValidationError as exc:
        problems = "; ".join(f"{_key(e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False))
        raise ConfigError(f"{path}: {problems}") from None


def _key(location: tuple[int | str, ...]) -> str:
    """The TOML key of an error: sweep[0].cron, agent.jitter_s."""
    if not location or location[0] != "sweep":
        return "agent." + ".".join(str(p) for p in location)
    key = "sweep"
    for part in location[1:]:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


@contextmanager
def sweep_lock(path: Path) -> Iterator[bool]:
    """Holds an exclusive lock on `path` (never waits): True if this process got it. A lock
    file, so that two daemons (or a daemon and a manual sweep) never measure at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def busy_reason(
    *,
    cpu_percent: float,
    gpu_percent: float | None,
    cpu_limit: float,
    gpu_limit: float,
) -> str | None:
    if cpu_percent > cpu_limit:
        return f"CPU {cpu_percent:.0f}% busy (limit {cpu_limit:.0f}%)"
    if gpu_percent is not None and gpu_percent > gpu_limit:
        return f"GPU {gpu_percent:.0f}% busy (limit {gpu_limit:.0f}%)"
    return None


def _gpu_percent() -> float | None:
    try:
        with nvml_session() as (nvml, _):
            if nvml is None:
                return None  # no NVIDIA GPU: nothing to guard
            rates = [
                nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(i)).gpu
                for i in range(nvml.nvmlDeviceGetCount())
            ]
    except Exception:  # NVML failing is no reason to hold sweeps back
        return None
    return float(max(rates)) if rates else None


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        settings: AgentSettings | None = None,
        *,
        load: Callable[[], tuple[float, float | None]] | None = None,
    ) -> None:
        settings = settings or AgentSettings()
        env_set = settings.model_fields_set  # FLEETBENCH_* variables win over the file
        self.config = config
        self.node = settings.node if "node" in env_set or not config.node else config.node
        self.registry_url = (
            settings.registry_url
            if "registry_url" in env_set or not config.registry_url
            else config.registry_url
        )
        token = settings.token if "token" in env_set or not config.token else config.token
        self.token = token.get_secret_value() if token else None
        self.spool = Spool(
            settings.spool if "spool" in env_set or not config.spool else config.spool,
            set_aside_after_5xx=config.set_aside_after_5xx,
            set_aside_after_attempts=config.set_aside_after_attempts,
            set_aside_after_s=config.set_aside_after_hours * 3600,
            keep_delivered_s=settings.spool_retention_days * 86400,
        )
        self.lock_path = self.spool.path.with_name("sweep.lock")
        self.sha256_cache = settings.cache_dir / "sha256.json"
        self.load = load or (lambda: (psutil.cpu_percent(interval=1.0), _gpu_percent()))
        self._state = _SweepState(self.spool.path.with_name("sweeps.db"))
        self.scheduler: Any = None
        self.unspooled: list[RunReport] = []  # runs a full disk kept out of the spool
        self._registry_down = True  # until a flush says otherwise: probe it when in doubt

    # --- one sweep ----------------------------------------------------------------------

    def run_sweep(self, sweep: SweepConfig, *, why: str) -> str:
        """Runs one sweep now unless the machine is busy or another sweep holds the lock;
        returns what happened. Never raises: a failed sweep is a failed run, reported."""
        cpu, gpu = self.load()
        busy = busy_reason(
            cpu_percent=cpu,
            gpu_percent=gpu,
            cpu_limit=self.config.busy_cpu_percent,
            gpu_limit=self.config.busy_gpu_percent,
        )
        if busy is not None:
            self._postpone(sweep, f"postponed {sweep.name} ({why}): {busy}")
            return "postponed: " + busy
        with sweep_lock(self.lock_path) as acquired:
            if not acquired:
                self._postpone(sweep, f"postponed {sweep.name} ({why}): another sweep is running")
                return "postponed: another sweep is running"
            log.info("sweep %s starts (%s)", sweep.name, why)
            status = self._sweep(sweep)
        self.flush()
        return status

    def _sweep(self, sweep: SweepConfig) -> str:
        report = measure_run(
            sweep.model,
            sweep.spec(),
            node=self.node,
            name=sweep.model_name,
            sha256_cache=self.sha256_cache,
            binary=sweep.binary,
        )
        try:
            self.spool.add(report)
        except SpoolUnwritable as exc:
            # Kept in memory until space is back, and in the log meanwhile, so that even a
            # stopped daemon loses nothing.
            self.unspooled.append(report)
            log.error(
                "sweep %s: run %s kept in memory, %s: %s",
                sweep.name,
                report.run_id,
                exc,
                report.model_dump_json(),
            )
        log.info("sweep %s: run %s %s", sweep.name, report.run_id, report.status)
        if report.status != "failed":
            self._state.record(sweep.name, self._identity(sweep))
        return report.status

    def _postpone(self, sweep: SweepConfig, message: str) -> None:
        log.warning(message)
        if self.scheduler is not None:
            self.scheduler.add_job(
                self.run_sweep,
                "date",
                run_date=datetime.now(UTC) + timedelta(seconds=self.config.busy_retry_s),
                args=[sweep],
                kwargs={"why": "postponed"},
                id=f"retry:{sweep.name}",
                replace_existing=True,
            )

    # --- changes since the last success ---------------------------------------------------

    def _identity(self, sweep: SweepConfig) -> dict[str, str]:
        """What a sweep's results depend on besides the machine: the engine (the binary's
        build, or llama-cpp-python's version, which fixes the llama.cpp it vendors) and the
        model file."""
        try:
            model = sha256_of(sweep.model, cache=self.sha256_cache)
        except OSError:
            model = "missing"
        return {**_engine_identity(sweep.binary), "model_sha256": model}

    def changed_since_last_success(self, sweep: SweepConfig) -> str | None:
        """Why the sweep should run now: its build or model changed since it last succeeded
        (or it never did). None when nothing changed."""
        before = self._state.last(sweep.name)
        now = self._identity(sweep)
        if before is None:
            return "no successful run yet"
        changed = [f"{k} {before.get(k)} -> {v}" for k, v in now.items() if before.get(k) != v]
        return "changed: " + ", ".join(changed) if changed else None

    def check_changes(self) -> None:
        for sweep in self.config.sweeps:
            if (why := self.changed_since_last_success(sweep)) is not None:
                self.run_sweep(sweep, why=why)

    def flush(self) -> None:
        """Writes the runs kept in memory to the spool, then delivers what is due. When runs
        wait out a backoff because the registry was down, asks its /healthz: answering
        again, every queued run goes now. A full disk is one line in the log."""
        try:
            self._spool_kept_runs()
            with RegistryClient(self.registry_url, token=self.token) as client:
                result = self.spool.flush(client)
                tried = result.delivered + result.rejected + result.deferred
                if not tried and self._registry_down and self.spool.counts()["queued"]:
                    if not client.healthy():
                        return
                    log.info("the registry answers again: delivering every queued run")
                    result = self.spool.flush(client, every_queued=True)
                    tried = result.delivered + result.rejected + result.deferred
        except SpoolUnwritable as exc:
            log.error("delivery waits: %s", exc)
            return
        if tried:
            self._registry_down = result.registry_down
            log.info(
                "delivery: %d delivered, %d rejected, %d waiting",
                result.delivered,
                result.rejected,
                result.deferred,
            )

    def _spool_kept_runs(self) -> None:
        """Moves the runs kept in memory into the spool; raises SpoolUnwritable while it
        still cannot take them."""
        while self.unspooled:
            report = self.unspooled[0]
            self.spool.add(report)
            self.unspooled.pop(0)
            log.info("run %s, kept in memory, is in the spool now", report.run_id)

    # --- the schedule ---------------------------------------------------------------------

    def serve(self) -> None:
        """Runs until stopped (SIGTERM or Ctrl-C)."""
        self.schedule()
        log.info(
            "daemon for node %s: %d sweep(s), registry %s, spool %s (pid %d)",
            self.node,
            len(self.config.sweeps),
            self.registry_url,
            self.spool.path,
            os.getpid(),
        )
        if (problem := self.spool.unwritable_reason()) is not None:
            log.error("%s: runs are kept in memory until it can", problem)
        self.scheduler.start()

    def schedule(self) -> None:
        """Makes the scheduler (not started) with every job: the sweeps, deliveries and
        change checks."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.blocking import BlockingScheduler
        from apscheduler.triggers.cron import CronTrigger

        # One worker: sweeps, change checks and deliveries never overlap in this process.
        self.scheduler = BlockingScheduler(
            executors={"default": ThreadPoolExecutor(1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
            timezone=UTC,
        )
        for sweep in self.config.sweeps:
            trigger = CronTrigger.from_crontab(sweep.cron)
            trigger.jitter = int(self.config.jitter_s) or None
            self.scheduler.add_job(
                self.run_sweep, trigger, args=[sweep], kwargs={"why": "scheduled"}, id=sweep.name
            )
        # Jitter: a fleet that lost the registry does not come back in the same second.
        self.scheduler.add_job(
            self.flush,
            "interval",
            seconds=self.config.flush_every_s,
            jitter=max(1, int(self.config.flush_every_s / 4)),
            id="flush",
        )
        self.scheduler.add_job(
            self.check_changes,
            "interval",
            seconds=self.config.check_changes_every_s,
            next_run_time=datetime.now(UTC),  # at start, too
        )


class _SweepState:
    """The engine and model each sweep last succeeded with (beside the spool). The table is
    made by the first success, so a daemon starts on a full disk; a success that cannot be
    recorded is a warning (the next check sweeps again), not a crash.

    The column named llama_cpp_python holds the engine's identity as a JSON object (it held
    llama-cpp-python's version alone before `binary =` sweeps existed; such a value still
    reads as that)."""

    _TABLE = (
        "CREATE TABLE IF NOT EXISTS last_success (sweep TEXT PRIMARY KEY,"
        " llama_cpp_python TEXT, model_sha256 TEXT, at REAL)"
    )

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def record(self, sweep: str, identity: dict[str, str]) -> None:
        try:
            with self._connect() as db:
                db.execute(self._TABLE)
                db.execute(
                    "INSERT OR REPLACE INTO last_success VALUES (?, ?, ?, ?)",
                    (
                        sweep,
                        json.dumps({k: v for k, v in identity.items() if k != "model_sha256"}),
                        identity["model_sha256"],
                        datetime.now(UTC).timestamp(),
                    ),
                )
        except sqlite3.OperationalError as exc:
            log.warning("sweep %s: its success cannot be recorded in %s: %s", sweep, self.path, exc)

    def last(self, sweep: str) -> dict[str, str] | None:
        if not self.path.exists():
            return None
        with self._connect() as db:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'last_success'").fetchone():
                row = db.execute(
                    "SELECT llama_cpp_python, model_sha256 FROM last_success WHERE sweep = ?",
                    (sweep,),
                ).fetchone()
            else:
                row = None
        if row is None:
            return None
        try:
            engine = json.loads(row[0])
        except ValueError:
            engine = None
        if not isinstance(engine, dict):  # recorded by an older agent: the version alone
            engine = {"llama-cpp-python": row[0]}
        return {**engine, "model_sha256": row[1]}
