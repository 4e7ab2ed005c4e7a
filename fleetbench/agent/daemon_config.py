"""agent.toml, the daemon's configuration: the `[[sweep]]` tables, and the `[agent]` table
that config.AgentSettings reads; validated so that a bad file stops the daemon at start with
the key named (`sweep[0].cron: ...`, `agent.jitter_s: ...`)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from fleetbench.agent.config import AgentSettings, SettingsError, load_settings
from fleetbench.agent.errors import EngineUnavailable, Location, validation_problems
from fleetbench.agent.runners import Runner, SweepSpec
from fleetbench.agent.runners.engines import runner_for

__all__ = ["ConfigError", "DaemonConfig", "SweepConfig", "load_config"]


class ConfigError(ValueError):
    """The daemon's configuration cannot work; the message names the key."""


class SweepConfig(SweepSpec):
    """One scheduled sweep: a model, a schedule, the engine, and the sweep's settings (a
    SweepSpec, by its names or llama.cpp's)."""

    name: str = Field(min_length=1)
    model: Path
    model_name: str | None = None
    cron: str = Field(description="crontab expression, e.g. '0 3 * * *'")
    repeats: int = Field(default=3, ge=1, le=1000)  # a schedule has time for the precision
    engine: str | None = Field(
        default=None, description="a runner's name [default: llama-cpp-python, or the binary's]"
    )
    binary: Path | None = Field(
        default=None, description="the node's llama-batched-bench, instead of in-process"
    )

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, cron: str) -> str:
        from apscheduler.triggers.cron import CronTrigger

        CronTrigger.from_crontab(cron)  # raises ValueError naming the bad field
        return cron

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


class _Sweeps(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweep: list[SweepConfig] = Field(default_factory=list)

    @field_validator("sweep")
    @classmethod
    def _unique_names(cls, sweeps: list[SweepConfig]) -> list[SweepConfig]:
        names = [s.name for s in sweeps]
        if len(set(names)) != len(names):
            raise ValueError(f"sweep names must be unique: {names}")
        if taken := [name for name in names if name.startswith("plan:")]:
            raise ValueError(f"names beginning with 'plan:' are the registry's plans': {taken}")
        return sweeps


@dataclass(frozen=True)
class DaemonConfig:
    """What the daemon runs with: the process's settings and the sweeps of agent.toml."""

    settings: AgentSettings
    sweeps: list[SweepConfig]


def load_config(path: Path) -> DaemonConfig:
    """Reads agent.toml: `[agent]` settings (under FLEETBENCH_* variables) and `[[sweep]]`
    tables (none: the node runs the registry's plans only). Raises ConfigError."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    if not isinstance(raw.get("agent", {}), dict) or not isinstance(raw.get("sweep", []), list):
        raise ConfigError(f"{path}: [agent] is one table and [[sweep]] a list of them")
    unknown = set(raw) - {"agent", "sweep"}
    if unknown:
        raise ConfigError(
            f"{path}: unknown table(s) {sorted(unknown)}; expected [agent], [[sweep]]"
        )
    try:
        settings = load_settings(path if "agent" in raw else None)
    except SettingsError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        sweeps = _Sweeps.model_validate({"sweep": raw.get("sweep", [])}).sweep
    except ValidationError as exc:
        raise ConfigError(f"{path}: {validation_problems(exc, _key)}") from None
    if not sweeps and not settings.plans:
        raise ConfigError(f"{path}: no [[sweep]] table, and the registry's plans are off")
    return DaemonConfig(settings, sweeps)


def _key(location: Location) -> str:
    """The TOML key of an error: sweep[0].cron."""
    key = "sweep"
    for part in location[1:]:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key
