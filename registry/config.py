"""The registry's settings: one object per process, read from FLEETBENCH_* variables
(or a .env file in the working directory)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    data_dir: Path = Field(default_factory=_default_data_dir)
    max_report_bytes: int = Field(
        default=8 * 1024 * 1024, gt=0, description="largest request body accepted (413 above)"
    )
    read_token_required: bool = Field(
        default=False, description="when true, every GET under /v1 needs a node token"
    )
    stale_after_hours: float = Field(
        default=48, gt=0, description="a node with no run for this long shows as stale"
    )
    webhook_url: str | None = Field(
        default=None, description="POSTed a JSON body for each new regression (retried)"
    )
    webhook_max_age_days: float = Field(
        default=7, gt=0, description="regressions whose first run is older are not sent"
    )
    public_url: str = Field(
        default="http://127.0.0.1:8787",
        description="the registry's address as people reach it, for links in webhooks",
    )

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'registry.db'}"

    @property
    def is_default_sqlite(self) -> bool:
        return not self.database_url
