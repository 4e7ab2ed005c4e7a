"""Alembic environment: the target is the registry's models' metadata; the database is the
engine handed over by registry.db, or the one the registry's settings name (for the
`alembic` command line, e.g. `alembic check`)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, Engine

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


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    # On the driver's connection, outside any transaction: SQLite ignores the pragma in one.
    driver = connection.connection.dbapi_connection
    assert driver is not None
    driver.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def _broken_references(connection: Connection) -> list[tuple[object, ...]]:
    return [tuple(row) for row in connection.exec_driver_sql("PRAGMA foreign_key_check")]


def run_migrations_online() -> None:
    with _engine().connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # Batch mode copies a table and drops the old one; enforced, that drop would
            # cascade to the rows referencing it. Checked below before the commit instead.
            _sqlite_foreign_keys(connection, on=False)
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            # SQLite cannot ALTER most things: batch mode copies the table instead.
            render_as_batch=sqlite,
        )
        try:
            with context.begin_transaction():
                # Checked only when there is something to migrate, and only for what the
                # migrations broke (not what was broken before).
                check = sqlite and context.get_context().get_current_revision() != (
                    context.get_head_revision()
                )
                before = set(_broken_references(connection)) if check else set()
                context.run_migrations()
                if check and (broken := set(_broken_references(connection)) - before):
                    raise RuntimeError(f"the migration broke references: {sorted(broken)[:10]}")
        finally:
            if sqlite:
                _sqlite_foreign_keys(connection, on=True)


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run them online")
run_migrations_online()
