"""Fresh databases for tests: a SQLite file, or a schema of its own in the PostgreSQL
database FLEETBENCH_TEST_POSTGRES_URL names (scripts/test.sh creates a throwaway one)."""

from __future__ import annotations

import os
import shutil
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
    """Brings the fresh database `url` to head (a SQLite one as a copy of a migrated file:
    faster than migrating each time)."""
    sqlite_path = make_url(url).database
    if url.startswith("sqlite") and sqlite_path:
        shutil.copy(migrated_sqlite_file, sqlite_path)
        return url
    engine = create_db_engine(url)
    upgrade_schema(engine)
    engine.dispose()
    return url
