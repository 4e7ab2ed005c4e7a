"""Alembic environment: the target is the registry's models' metadata; the database is the
engine handed over by registry.db, or the one the registry's settings name (for the
`alembic` command line, e.g. `alembic check`)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import create_db_engine
from fleetbench.registry.models import Base

config = context.config
target_metadata = Base.metadata


def _engine() -> Engine:
    engine = config.attributes.get("engine")
    if isinstance(engine, Engine):
        return engine
    return create_db_engine(RegistrySettings().sqlalchemy_url)


def run_migrations_online() -> None:
    with _engine().connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            # SQLite cannot ALTER most things: batch mode copies the table instead.
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run them online")
run_migrations_online()
