"""agent.toml, the daemon's configuration: the `[[sweep]]` tables (offline sweeps of the
engine), the `[[serve_sweep]]` tables (serving sweeps of the server the team runs), and the
`[agent]` table that config.AgentSettings reads; validated so that a bad file stops the
daemon at start with the key named (`sweep[0].cron: ...`, `agent.jitter_s: ...`).

Both kinds of sweep are what the daemon schedules (`ScheduledSweep`): a name, a cron
schedule, what its results depend on (its identity: a change sweeps at once), and a
measurement that gives a run report, or why it was put off."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from fleetbench.agent.config import AgentSettings, SettingsError, load_settings
from fleetbench.agent.errors import EngineUnavailable, Location, validation_problems
from fleetbench.agent.gguf_model import sha256_of
from fleetbench.agent.runners import Runner, SweepSpec
from fleetbench.agent.runners.engines import runner_for
from fleetbench.agent.serving.report import measure_serving
from fleetbench.agent.serving.servers import identify_at
from fleetbench.agent.sweep import measure_run
from fleetbench.contract.bounds import Name
from fleetbench.contract.serve_spec import ServerUrl, ServeSpec
from fleetbench.contract.sweep_spec import SCHEDULED_REPEATS, Repeats
from fleetbench.contract.wire import RunReport

__all__ = [
    "ConfigError",
    "DaemonConfig",
    "ScheduledSweep",
    "ServeSweepConfig",
    "SweepConfig",
    "load_config",
]


class ConfigError(ValueError):
    """The daemon's configuration cannot work; the message names the key."""


class ScheduledSweep(Protocol):
    """What the daemon runs on a schedule."""

    @property
    def name(self) -> str: ...
    @property
    def cron(self) -> str: ...

    # Whether the machine's own CPU and GPU load puts it off (a serving sweep asks the
    # server whether it is busy instead: its load is what it measures).
    busy_guard: ClassVar[bool]

    def identity(self, sha256_cache: Path) -> dict[str, str] | None:
        """What its results depend on besides the machine (None: not known now)."""
        ...

    def measure(self, node: str, sha256_cache: Path) -> RunReport | str:
        """The run, or why it was put off."""
        ...

    def model_dump_json(self) -> str: ...


def _valid_cron(cron: str) -> str:
    from apscheduler.triggers.cron import CronTrigger

    CronTrigger.from_crontab(cron)  # raises ValueError naming the bad field
    return cron


Cron = Annotated[
    str, AfterValidator(_valid_cron), Field(description="crontab expression, e.g. '0 3 * * *'")
]


class SweepConfig(SweepSpec):
    """One scheduled sweep: a model, a schedule, the engine, and the sweep's settings (a
    SweepSpec, by its names or llama.cpp's)."""

    busy_guard: ClassVar[bool] = True

    name: str = Field(min_length=1)
    model: Path
    model_name: str | None = None
    cron: Cron
    repeats: Repeats = SCHEDULED_REPEATS
    engine: str | None = Field(
        default=None, description="a runner's name [default: llama-cpp-python, or the binary's]"
    )
    binary: Path | None = Field(
        default=None, description="the node's llama-batched-bench, instead of in-process"
    )

    _runner: Runner = PrivateAttr()

    @model_validator(mode="after")
    def _engine_runs_here(self) -> SweepConfig:
        # An unknown or missing engine stops the daemon at start; made once, the runner
        # reports later trouble (an engine removed meanwhile) as a failed run.
        try:
            self._runner = runner_for(self.engine, self.binary)
        except EngineUnavailable as exc:
            raise ValueError(str(exc)) from None
        return self

    def spec(self) -> SweepSpec:
        return SweepSpec.model_validate(self.model_dump(include=set(SweepSpec.model_fields)))

    def runner(self) -> Runner:
        return self._runner

    def identity(self, sha256_cache: Path) -> dict[str, str]:
        """The engine (as its runner tells it: llama-cpp-python's version, the binary's
        build) and the model file."""
        try:
            model = sha256_of(self.model, cache=sha256_cache)
        except OSError:
            model = "missing"
        return {**self.runner().identity(), "model_sha256": model}

    def measure(self, node: str, sha256_cache: Path) -> RunReport:
        return measure_run(
            self.model,
            self.spec(),
            self.runner(),
            node=node,
            name=self.model_name,
            sha256_cache=sha256_cache,
        )


class ServeSweepConfig(ServeSpec):
    """One scheduled serving sweep: the server's URL, the model it serves (as reports name
    it), a schedule, and the load (a ServeSpec: concurrencies or an objective to search)."""

    busy_guard: ClassVar[bool] = False

    name: str = Field(min_length=1)
    url: ServerUrl
    model: Name
    cron: Cron

    def spec(self) -> ServeSpec:
        return ServeSpec.model_validate(self.model_dump(include=set(ServeSpec.model_fields)))

    def identity(self, sha256_cache: Path) -> dict[str, str] | None:
        """The server as it says it is: its make and build, the model file it serves, its
        slots and context (None: it does not answer)."""
        server = identify_at(self.url)
        if server is None:
            return None
        return {
            "server": f"{server.kind} {server.build or 'unknown'}",
            "model": self.model,
            "model_path": str(server.model_path),
            "slots": f"{server.slots} x {server.ctx_per_slot} of {server.n_ctx}",
        }

    def measure(self, node: str, sha256_cache: Path) -> RunReport | str:
        return measure_serving(self.url, self.model, self.spec(), node=node)


class _Sweeps(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweep: list[SweepConfig] = Field(default_factory=list)
    serve_sweep: list[ServeSweepConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> _Sweeps:
        names = [s.name for s in self.sweep] + [s.name for s in self.serve_sweep]
        if len(set(names)) != len(names):
            raise ValueError(
                f"sweep names must be unique across [[sweep]] and [[serve_sweep]]: {names}"
            )
        if taken := [name for name in names if name.startswith("plan:")]:
            raise ValueError(f"names beginning with 'plan:' are the registry's plans': {taken}")
        return self


@dataclass(frozen=True)
class DaemonConfig:
    """What the daemon runs with: the process's settings and the sweeps of agent.toml."""

    settings: AgentSettings
    sweeps: list[ScheduledSweep]


_TABLES = ("agent", "sweep", "serve_sweep")


def load_config(path: Path) -> DaemonConfig:
    """Reads agent.toml: `[agent]` settings (under FLEETBENCH_* variables), `[[sweep]]` and
    `[[serve_sweep]]` tables (none: the node runs the registry's plans only). Raises
    ConfigError."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    if not isinstance(raw.get("agent", {}), dict) or not all(
        isinstance(raw.get(table, []), list) for table in _TABLES[1:]
    ):
        raise ConfigError(
            f"{path}: [agent] is one table, [[sweep]] and [[serve_sweep]] lists of them"
        )
    unknown = set(raw) - set(_TABLES)
    if unknown:
        raise ConfigError(
            f"{path}: unknown table(s) {sorted(unknown)}; expected [agent], [[sweep]], "
            "[[serve_sweep]]"
        )
    try:
        settings = load_settings(path if "agent" in raw else None)
    except SettingsError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        tables = _Sweeps.model_validate({t: raw[t] for t in _TABLES[1:] if t in raw})
    except ValidationError as exc:
        raise ConfigError(f"{path}: {validation_problems(exc, _key)}") from None
    sweeps: list[ScheduledSweep] = [*tables.sweep, *tables.serve_sweep]
    if not sweeps and not settings.plans:
        raise ConfigError(
            f"{path}: no [[sweep]] or [[serve_sweep]] table, and the registry's plans are off"
        )
    return DaemonConfig(settings, sweeps)


def _key(location: Location) -> str:
    """The TOML key of an error: sweep[0].cron, serve_sweep[1].url."""
    key = str(location[0]) if location else "sweep"
    for part in location[1:]:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key
