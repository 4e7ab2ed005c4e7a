"""Engine, sessions and the schema's migration state. The only module that opens the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

import migrations

__all__ = [
    "SchemaOutOfDate",
    "alembic_config",
    "begin_write",
    "create_db_engine",
    "ensure_schema_current",
    "schema_revisions",
    "session_factory",
    "upgrade_schema",
]

_MIGRATIONS_DIR = Path(migrations.__file__).parent
_WRITE_OPTION = "fleetbench_write"


class SchemaOutOfDate(RuntimeError):
    """The database is not at the migrations' head revision."""


def create_db_engine(url: str, **kwargs: Any) -> Engine:
    sa_url = make_url(url)
    if sa_url.get_backend_name() == "sqlite":
        if sa_url.database and sa_url.database != ":memory:":
            Path(sa_url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(sa_url, connect_args={"timeout": 30}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(sa_url, pool_pre_ping=True, **kwargs)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN (pysqlite's own would be deferred).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # Foreign keys are off by default in SQLite; WAL lets readers run beside the writer.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    # A deferred transaction that has read cannot take the write lock once another writer
    # has committed (SQLITE_BUSY at once, no waiting): writers start IMMEDIATE instead.
    immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def begin_write(session: Session) -> None:
    """Start the session's transaction as one that will write (matters on SQLite only)."""
    session.connection(execution_options={_WRITE_OPTION: True})


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def schema_revisions(engine: Engine) -> tuple[str | None, str | None]:
    """(current revision of the database, head revision of the migrations). Raises
    SchemaOutOfDate when the database was migrated by a newer fleetbench."""
    scripts = ScriptDirectory.from_config(alembic_config(engine))
    head = scripts.get_current_head()
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    if current is not None and current not in {s.revision for s in scripts.walk_revisions()}:
        raise SchemaOutOfDate(
            f"database schema is at revision {current}, which this registry does not know "
            f"(its newest is {head}): the database was upgraded by a newer fleetbench"
        )
    return current, head


def upgrade_schema(engine: Engine) -> None:
    schema_revisions(engine)  # refuses a database from a newer fleetbench
    command.upgrade(alembic_config(engine), "head")


def ensure_schema_current(engine: Engine, *, fix_command: str) -> None:
    current, head = schema_revisions(engine)
    if current != head:
        raise SchemaOutOfDate(
            f"database schema is at revision {current or 'none (empty database)'}, "
            f"the registry needs {head}: run `{fix_command}`"
        )
