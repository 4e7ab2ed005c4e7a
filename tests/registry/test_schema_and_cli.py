"""The schema (0.1.0's baseline, down and up; a development build's database refused) and
the registry's command line."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from fleetbench.registry.db import (
    alembic_config,
    create_db_engine,
    schema_revisions,
    upgrade_schema,
)
from tests.factories import free_port, wait_until_serving

REGISTRY = [sys.executable, "-m", "fleetbench.registry.cli"]


def _run(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        REGISTRY + args, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )


def test_migrations_match_the_models(engine: Engine) -> None:
    # `alembic check`: autogenerate finds nothing to add, drop or alter
    command.check(alembic_config(engine))
    current, head = schema_revisions(engine)
    assert current == head is not None
    tables = set(inspect(engine).get_table_names())
    assert {
        "nodes",
        "tokens",
        "hardware_fingerprints",
        "engine_builds",
        "models",
        "runs",
        "run_points",
        "failed_points",
    } <= tables


def test_the_baseline_goes_down_to_nothing_and_back_up_to_the_models(engine: Engine) -> None:
    """One migration per release, each tested both ways on both databases: 0.1.0's."""
    before = _schema(engine)
    command.downgrade(alembic_config(engine), "base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    assert schema_revisions(engine)[0] is None
    assert upgrade_schema(engine) is None
    assert _schema(engine) == before
    command.check(alembic_config(engine))
    with engine.connect() as connection:  # the row every registry process watches
        assert connection.execute(text("SELECT id, epoch FROM token_epoch")).all() == [(1, 0)]


def _schema(engine: Engine) -> dict[str, object]:
    found = inspect(engine)
    return {
        table: (
            [(c["name"], str(c["type"]), c["nullable"]) for c in found.get_columns(table)],
            sorted((i["name"] or "", i["column_names"]) for i in found.get_indexes(table)),
            sorted(tuple(f["constrained_columns"]) for f in found.get_foreign_keys(table)),
        )
        for table in found.get_table_names()
    }


def test_a_database_of_a_development_build_before_0_1_0_is_refused_untouched(
    database_url: str,
) -> None:
    engine = create_db_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0021'")
        before = _schema(engine)
    finally:
        engine.dispose()
    env = {"FLEETBENCH_DATABASE_URL": database_url}
    for command_line in (["serve", "--port", "1"], ["migrate"], ["token", "list"]):
        result = _run(command_line, env)
        assert result.returncode == 1, result.stderr
        assert (
            "database schema is at revision 0021, made by a development build of fleetbench "
            "before 0.1.0, which 0.1.0 does not upgrade (CHANGELOG.md)"
        ) in result.stderr
        assert "Traceback" not in result.stderr
    engine = create_db_engine(database_url)
    try:
        assert _schema(engine) == before
        with engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version"))
            assert version.scalar_one() == "0021"
    finally:
        engine.dispose()


def test_serve_refuses_an_out_of_date_schema_then_migrate_fixes_it(
    empty_database_url: str,
) -> None:
    env = {"FLEETBENCH_DATABASE_URL": empty_database_url}
    refused = _run(["serve", "--port", "1"], env)
    assert refused.returncode == 1
    assert "run `fleetbench-registry migrate`" in refused.stderr
    assert "empty database" in refused.stderr

    migrated = _run(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    assert "upgraded from empty to" in migrated.stderr
    again = _run(["migrate"], env)
    assert "already at" in again.stderr
    engine = create_db_engine(empty_database_url)
    try:
        current, head = schema_revisions(engine)
    finally:
        engine.dispose()
    assert current == head


def test_token_create_prints_only_the_token(database_url: str) -> None:
    result = _run(
        ["token", "create", "--node", "m4pro", "--label", "site=lab"],
        {"FLEETBENCH_DATABASE_URL": database_url},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("fbn_") and len(lines[0]) > 40
    bad = _run(
        ["token", "create", "--node", "x", "--label", "nolabel"],
        {"FLEETBENCH_DATABASE_URL": database_url},
    )
    assert bad.returncode == 2
    assert "KEY=VALUE" in bad.stderr


def test_default_sqlite_is_created_upgraded_and_served(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path), "FLEETBENCH_DATABASE_URL": ""}
    token = _run(["token", "create", "--node", "m4pro"], env)
    database = tmp_path / "fleetbench" / "registry.db"
    assert token.returncode == 0, token.stderr
    assert f"SQLite file {database}" in token.stderr
    assert database.exists()

    port = free_port()
    server = subprocess.Popen(
        [*REGISTRY, "serve", "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        health = wait_until_serving(f"http://127.0.0.1:{port}", server, seconds=30)
        assert health.json()["status"] == "ok"
        docs = httpx.get(f"http://127.0.0.1:{port}/openapi.json").json()
        assert "RunReport" in docs["components"]["schemas"]
        assert "/v1/placement" in docs["paths"]
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert f"registry database: SQLite file {database}" in output


def test_a_database_from_a_newer_fleetbench_is_refused(database_url: str) -> None:
    engine = create_db_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    finally:
        engine.dispose()
    env = {"FLEETBENCH_DATABASE_URL": database_url}
    for command_line in (["serve", "--port", "1"], ["migrate"]):
        result = _run(command_line, env)
        assert result.returncode == 1
        assert "revision 9999, which this registry does not know" in result.stderr
        assert "upgraded by a newer fleetbench" in result.stderr


def test_serve_speaks_https_with_a_certificate(tmp_path: Path, database_url: str) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    port = free_port()
    argv = [*REGISTRY, "serve", "--port", str(port), "--ssl-certfile", str(cert)]
    half = _run(argv[3:], {"FLEETBENCH_DATABASE_URL": database_url})
    assert half.returncode == 2 and "give both or neither" in half.stderr
    server = subprocess.Popen(
        [*argv, "--ssl-keyfile", str(key)],
        env={**os.environ, "FLEETBENCH_DATABASE_URL": database_url},
        stderr=subprocess.DEVNULL,
    )
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        health = wait_until_serving(f"https://127.0.0.1:{port}", server, verify=trusted)
        assert health.json()["status"] == "ok"
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP is not spoken
            httpx.get(f"http://127.0.0.1:{port}/healthz")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_postgresql_connections_never_compile_queries(postgres_database_url: str) -> None:
    """JIT off on every connection of the pool: a query whose estimated cost passes
    jit_above_cost would otherwise spend tens of ms of CPU compiling (bench/load.py)."""
    engine = create_db_engine(postgres_database_url, pool_size=2)
    try:
        with engine.connect() as one, engine.connect() as two:
            assert [c.exec_driver_sql("SHOW jit").scalar() for c in (one, two)] == ["off"] * 2
    finally:
        engine.dispose()
