"""Fresh databases for tests: a SQLite file, or a schema of its own in the PostgreSQL
database FLEETBENCH_TEST_POSTGRES_URL names (scripts/test.sh creates a throwaway one)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from fleetbench.registry.db import create_db_engine, upgrade_schema

__all__ = ["POSTGRES_URL", "fresh_database", "migrate"]

POSTGRES_URL = os.environ.get(
    "FLEETBENCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@contextmanager
def fresh_database(kind: str, folder: Path) -> Iterator[str]:
    """The URL of a fresh database with no schema at all: a SQLite file in `folder`, or a
    PostgreSQL schema of its own, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'registry.db'}"
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_db_engine(POSTGRES_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def migrate(url: str, migrated_sqlite_file: Path) -> str:
    """Brings the fresh database `url` to head: a SQLite one as a copy of a migrated file, a
    PostgreSQL schema as a replay of pg_dump's script of the first schema this process
    migrated (a few times faster than migrating each time, and the same tables, indexes,
    constraints and rows)."""
    sqlite_path = make_url(url).database
    if url.startswith("sqlite") and sqlite_path:
        shutil.copy(migrated_sqlite_file, sqlite_path)
        return url
    global _head_script
    schema = _schema_of(url)
    engine = create_db_engine(url)
    try:
        if _head_script is None:
            upgrade_schema(engine)
            _head_script = _schema_script(schema)
        else:
            # no parameters: the script is sent as it is, a % in it never read as one
            with engine.begin() as connection:
                replay = connection.execution_options(no_parameters=True)
                replay.exec_driver_sql(_head_script.replace(_SCHEMA_PLACEHOLDER, schema))
    finally:
        engine.dispose()
    return url


_SCHEMA_PLACEHOLDER = "fleetbench_schema_placeholder"
_head_script: str | None = None  # this process's first migrated schema, as pg_dump wrote it


def _schema_of(url: str) -> str:
    options = make_url(url).query.get("options", "")
    found = re.fullmatch(r"-csearch_path=(t_[0-9a-f]{12})", str(options))
    assert found, f"not a schema of fresh_database's: {url}"
    return found.group(1)


def _schema_script(schema: str) -> str:
    """pg_dump's SQL for `schema` (its rows as INSERTs), the schema's name a placeholder, and
    without what would reset the session or make the schema again."""
    server = make_url(POSTGRES_URL)
    assert shutil.which("pg_dump"), "pg_dump (PostgreSQL's client) is needed beside the server"
    dumped = subprocess.run(
        [
            "pg_dump",
            f"--host={server.host or '127.0.0.1'}",
            f"--port={server.port or 5432}",
            f"--username={server.username or 'postgres'}",
            f"--schema={schema}",
            "--no-owner",
            "--no-privileges",
            "--inserts",
            server.database or "postgres",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PGPASSWORD": server.password or ""},
    ).stdout
    left_out = ("CREATE SCHEMA", "SELECT pg_catalog.set_config", "SET ", "--", "\\")
    kept = [line for line in dumped.splitlines() if not line.startswith(left_out)]
    return "\n".join(kept).replace(f"{schema}.", f"{_SCHEMA_PLACEHOLDER}.")
