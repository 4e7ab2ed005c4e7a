"""The agent's settings, from FLEETBENCH_* variables (command-line options override them)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_REGISTRY_URL", "AgentSettings"]

DEFAULT_REGISTRY_URL = "http://127.0.0.1:8787"


def _default_spool() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "fleetbench" / "spool.db"


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fleetbench"


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEETBENCH_", env_ignore_empty=True, extra="ignore"
    )

    registry_url: str = Field(default=DEFAULT_REGISTRY_URL, description="the registry's base URL")
    token: SecretStr | None = Field(default=None, description="this node's registry token")
    spool: Path = Field(
        default_factory=_default_spool, description="where finished runs wait for delivery"
    )
    spool_retention_days: float = Field(
        default=7, gt=0, description="delivered runs are pruned from the spool after this long"
    )
    cache_dir: Path = Field(
        default_factory=_default_cache, description="model digests by path, size and mtime"
    )
    node: str = Field(
        default_factory=socket.gethostname, min_length=1, description="this node's name"
    )
