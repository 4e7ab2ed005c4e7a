"""The agent's settings: one object per process, from FLEETBENCH_* variables, then the
`[agent]` table of the daemon's agent.toml when there is one, then the defaults (command-line
options override them all). A bad value is a SettingsError naming the variable or the key."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from fleetbench.agent.errors import Location, validation_problems
from fleetbench.agent.spool import Spool
from fleetbench.contract.serve_spec import ServerUrl

__all__ = ["DEFAULT_REGISTRY_URL", "AgentSettings", "SettingsError", "load_settings", "open_spool"]

DEFAULT_REGISTRY_URL = "http://127.0.0.1:8787"
log = logging.getLogger("fleetbench.agent")
_PREFIX = "FLEETBENCH_"


def _default_spool() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "fleetbench" / "spool.db"


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fleetbench"


def _absolute(path: Path) -> Path:
    if not path.is_absolute():  # else it would mean whatever the daemon's directory is
        raise ValueError(f"{path} is not an absolute path")
    return path


AbsolutePath = Annotated[Path, AfterValidator(_absolute)]


class SettingsError(ValueError):
    """A setting cannot work; the message names the variable or the agent.toml key."""


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=_PREFIX, env_ignore_empty=True, extra="forbid")

    # who this node is and where its runs go
    node: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        description="this node's name; default: the hostname",
    )
    registry_url: str = Field(default=DEFAULT_REGISTRY_URL, description="the registry's base URL")
    token: SecretStr | None = Field(default=None, description="this node's registry token")
    token_file: Path | None = Field(
        default=None,
        description="a file holding the token instead, read again before each delivery: "
        "a rotated token is taken up without a restart",
    )
    spool: Path = Field(
        default_factory=_default_spool,
        description="where finished runs wait for delivery; default: "
        "$XDG_STATE_HOME/fleetbench/spool.db (~/.local/state/...)",
    )
    spool_retention_days: float = Field(
        default=7, gt=0, description="delivered runs are pruned from the spool after this long"
    )
    set_aside_after_5xx: int = Field(
        default=5,
        ge=1,
        description="a run is set aside (kept, no longer sent) after this many 5xx answers "
        "while others are delivered",
    )
    set_aside_after_attempts: int = Field(
        default=20, ge=1, description="... or after this many failed attempts ..."
    )
    set_aside_after_hours: float = Field(default=24, gt=0, description="... and failing this long")
    cache_dir: Path = Field(
        default_factory=_default_cache,
        description="model digests by path, size and mtime; default: $XDG_CACHE_HOME/"
        "fleetbench (~/.cache/...)",
    )
    # the daemon's schedule
    jitter_s: float = Field(default=300, ge=0, description="random delay of each sweep")
    flush_every_s: float = Field(
        default=60, gt=0, description="how often the daemon delivers its spool"
    )
    check_changes_every_s: float = Field(
        default=3600,
        gt=0,
        description="how often the daemon checks whether a sweep's engine, model or server "
        "build changed since it last succeeded (a change sweeps at once)",
    )
    busy_cpu_percent: float = Field(
        default=80, gt=0, le=100, description="a sweep waits while the CPU is busier than this"
    )
    busy_gpu_percent: float = Field(
        default=20, gt=0, le=100, description="... or a GPU is busier than this"
    )
    busy_retry_s: float = Field(
        default=900,
        gt=0,
        description="how long a sweep postponed as busy waits before it tries again",
    )
    # what else may use the node while a run measures (agent/contention.py)
    contention_cpu_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="a run counts as measured under contention (kept out of placement and "
        "regression baselines by the registry) when other processes used more than this "
        "share of all CPUs while it ran (1: never)",
    )
    contention_gpu_processes: bool = Field(
        default=True,
        description="... or when another process used a GPU the run's own processes "
        "used (as NVML lists them; not judged in a container with process ids of its own)",
    )
    # the registry's sweep plans (fleetbench.contract.plans), beside agent.toml's own
    plans: bool = Field(default=True, description="run the sweep plans the registry has")
    plan_poll_s: float = Field(
        default=300, gt=0, description="how often the plans are pulled (and at start)"
    )
    plan_binaries: list[Path] = Field(
        default_factory=list,
        description="the llama-batched-bench binaries a plan may run here (none: a plan "
        "that names one is skipped): the registry never chooses what a node executes. Each "
        "also runs the llama-server of its build beside it, for the output fingerprint",
    )
    plan_model_dirs: list[AbsolutePath] = Field(
        default_factory=list,
        description="the directories a plan may load its model from, its path and search_dirs "
        "alike, symlinks and .. resolved (none: a plan that names a model is skipped): the "
        "registry never chooses which of a node's files is read",
    )
    plan_serve_urls: list[ServerUrl] = Field(
        default_factory=list,
        description="the servers a serving plan may load-test from here (none: every "
        "serving plan is skipped): the registry never chooses where a node sends load",
    )

    @model_validator(mode="after")
    def _one_token(self) -> AgentSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("give token or token_file, not both")
        return self

    def current_token(self) -> str | None:
        """The token to deliver with now: token_file's content as it is now, or token.
        A token file that cannot be read is no token (the registry's 401 is retried, so
        no run is lost), with the reason logged."""
        if self.token_file is None:
            return self.token.get_secret_value() if self.token else None
        try:
            return self.token_file.read_text().strip() or None
        except OSError as exc:
            log.error("cannot read the token file: %s", exc)
            return None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Variables win over the file, so one fleet-wide agent.toml can be bent per node.
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_table_header=("agent",)),
        )


def load_settings(toml: Path | None = None) -> AgentSettings:
    """The settings, with the [agent] table of `toml` (a TOML file that has one) under the
    variables. Raises SettingsError."""
    settings_cls = AgentSettings
    if toml is not None:

        class FromFile(AgentSettings):
            model_config = SettingsConfigDict(toml_file=toml)

        settings_cls = FromFile
    try:
        return settings_cls()
    except ValidationError as exc:
        raise SettingsError(validation_problems(exc, _source)) from None


def _source(location: Location) -> str:
    """The variable a bad value came from, or else the [agent] key; an item of a list
    after it (`FLEETBENCH_PLAN_MODEL_DIRS[0]`, `agent.plan_model_dirs[0]`)."""
    if not location:  # about the settings together (token and token_file)
        return "agent"
    field, *within = location
    variable = _PREFIX + str(field).upper()
    given = {k.upper(): k for k, v in os.environ.items() if v}  # empty ones are ignored
    item = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in within)
    return given.get(variable, f"agent.{field}") + item


def open_spool(settings: AgentSettings) -> Spool:
    """The spool the settings describe, with their rules for setting runs aside."""
    return Spool(
        settings.spool,
        set_aside_after_5xx=settings.set_aside_after_5xx,
        set_aside_after_attempts=settings.set_aside_after_attempts,
        set_aside_after_s=settings.set_aside_after_hours * 3600,
        keep_delivered_s=settings.spool_retention_days * 86400,
    )
