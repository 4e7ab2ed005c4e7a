"""What every `fleetbench-registry` command that opens the database shares: its messages on
stderr, and the database opened with its schema checked."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import (
    SchemaOutOfDate,
    create_db_engine,
    ensure_schema_current,
    upgrade_schema,
)

__all__ = ["describe", "engine_of", "err", "error", "open_database"]

# Messages go to stderr: `token create` prints only the token on stdout. No markup: what
# they quote (a token's name, a database error) prints as written.
err = Console(stderr=True, soft_wrap=True, markup=False)


def error(message: str) -> None:
    err.print(Text.assemble(("error:", "red"), " ", message))


def describe(settings: RegistrySettings) -> str:
    url = make_url(settings.sqlalchemy_url)
    if url.get_backend_name() == "sqlite":
        return f"SQLite file {url.database}"
    return f"{url.get_backend_name()} database {url.render_as_string(hide_password=True)}"


def engine_of(settings: RegistrySettings) -> Engine:
    err.print(f"registry database: {describe(settings)}")
    return create_db_engine(settings.sqlalchemy_url)


def open_database(settings: RegistrySettings) -> Engine:
    """The engine, with the schema at head. The embedded default SQLite file is upgraded on
    its own; any other database is left for an explicit `migrate`."""
    engine = engine_of(settings)
    try:
        if settings.is_default_sqlite:
            upgrade_schema(engine)
        else:
            ensure_schema_current(engine, fix_command="fleetbench-registry migrate")
    except SchemaOutOfDate as exc:
        error(str(exc))
        raise typer.Exit(1) from exc
    return engine
