"""Engine, sessions, write transactions and the schema's migration state. The only module
that opens the database."""

from __future__ import annotations

import fcntl
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from fleetbench import migrations

__all__ = [
    "SchemaOutOfDate",
    "alembic_config",
    "create_db_engine",
    "ensure_schema_current",
    "schema_revisions",
    "session_factory",
    "upgrade_schema",
    "write_transaction",
]

_MIGRATIONS_DIR = Path(migrations.__file__).parent
_WRITE_OPTION = "fleetbench_write"
# Any constant: every fleetbench process that migrates a PostgreSQL database takes this
# advisory lock first, so registries starting together migrate one after the other.
_MIGRATION_LOCK_KEY = 0x666C656574  # "fleet"
# SQLite's own wait for another process's write lock; within a process writers queue on
# a Python lock first (write_transaction), so this is only for other processes.
_SQLITE_BUSY_TIMEOUT_S = 10
_sqlite_writers: weakref.WeakKeyDictionary[Engine, threading.Lock] = weakref.WeakKeyDictionary()


# The revisions of the development builds before 0.1.0, whose migrations 0.1.0's baseline
# replaced: such a database is refused, never half-migrated (CHANGELOG.md, 0.1.0).
_BEFORE_0_1_0 = frozenset(f"{n:04d}" for n in range(1, 22))


class SchemaOutOfDate(RuntimeError):
    """The database is not at the migrations' head revision."""


def create_db_engine(
    url: str, *, pool_size: int = 5, pool_timeout: float = 10.0, **kwargs: Any
) -> Engine:
    """An engine with a fixed pool of `pool_size` connections (no overflow: the registry
    admits no more requests at once than its pool holds, registry.admission); a checkout
    that still waits `pool_timeout` seconds fails, and is answered 503."""
    sa_url = make_url(url)
    pool = {"pool_size": pool_size, "max_overflow": 0, "pool_timeout": pool_timeout}
    if sa_url.get_backend_name() == "sqlite":
        memory = not sa_url.database or sa_url.database == ":memory:"
        if not memory:
            Path(sa_url.database or "").parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            sa_url,
            connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
            **({} if memory else pool),
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        _sqlite_writers[engine] = threading.Lock()
        return engine
    engine = create_engine(sa_url, pool_pre_ping=True, **pool, **kwargs)
    event.listen(engine, "connect", _postgresql_settings)
    return engine


def _postgresql_settings(dbapi_connection: Any, _record: Any) -> None:
    # No JIT: every query here is short, and PostgreSQL compiles one whose estimated cost
    # passes jit_above_cost (estimates a fresh table's statistics inflate): 20-40 ms of
    # CPU for a query that runs in 2 (the node list, measured with bench/load.py).
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET jit = off")
    dbapi_connection.commit()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN (pysqlite's own would be deferred).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # Foreign keys are off by default in SQLite; WAL lets readers run beside the writer.
    # synchronous stays FULL: a run answered 201 is on disk, since the agent then lets it go.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    # A deferred transaction that has read cannot take the write lock once another writer
    # has committed (SQLITE_BUSY at once, no waiting): writers start IMMEDIATE instead.
    immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextmanager
def write_transaction(session: Session) -> Iterator[Session]:
    """The session's transaction as one that writes, committed by the caller inside the
    block (rolled back on an exception, or when left uncommitted).

    On SQLite the database has one writer at a time: this process's writers queue on a
    lock before BEGIN IMMEDIATE, so each waits its turn without spinning in SQLite's busy
    handler, and the lock is held only from BEGIN to the commit. Do the Python work (parsing,
    validation) before entering."""
    if session.in_transaction():
        session.commit()  # a read transaction before: a write must start afresh (SQLite)
    engine = session.get_bind()
    lock = _sqlite_writers.get(engine) if isinstance(engine, Engine) else None
    if lock is not None:
        lock.acquire()
    try:
        session.connection(execution_options={_WRITE_OPTION: True})
        try:
            yield session
        finally:
            session.rollback()  # nothing, after a commit
    finally:
        if lock is not None:
            lock.release()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def schema_revisions(engine: Engine) -> tuple[str | None, str | None]:
    """(current revision of the database, head revision of the migrations). Raises
    SchemaOutOfDate when the database was made by a development build before 0.1.0 or
    migrated by a newer fleetbench."""
    scripts = ScriptDirectory.from_config(alembic_config(engine))
    head = scripts.get_current_head()
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    if current in _BEFORE_0_1_0:
        raise SchemaOutOfDate(
            f"database schema is at revision {current}, made by a development build of "
            "fleetbench before 0.1.0, which 0.1.0 does not upgrade (CHANGELOG.md): export "
            "what you need from it with that build, and give this registry an empty database"
        )
    if current is not None and current not in {s.revision for s in scripts.walk_revisions()}:
        raise SchemaOutOfDate(
            f"database schema is at revision {current}, which this registry does not know "
            f"(its newest is {head}): the database was upgraded by a newer fleetbench"
        )
    return current, head


def upgrade_schema(engine: Engine) -> str | None:
    """Upgrades to head; returns the revision the database was at (None: empty). Several
    processes may call this at once (registries starting together): they take a lock first,
    and whoever comes second finds the work done."""
    with _migration_lock(engine):
        before, _ = schema_revisions(engine)  # refuses a database from a newer fleetbench
        command.upgrade(alembic_config(engine), "head")
    return before


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """PostgreSQL: a session advisory lock; a SQLite file: a lock file beside it."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            try:
                yield
            finally:
                connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                )
                connection.commit()
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    with Path(f"{database}.migrate-lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_schema_current(engine: Engine, *, fix_command: str) -> None:
    current, head = schema_revisions(engine)
    if current != head:
        raise SchemaOutOfDate(
            f"database schema is at revision {current or 'none (empty database)'}, "
            f"the registry needs {head}: run `{fix_command}`"
        )
