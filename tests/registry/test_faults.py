"""Faults while reports arrive: the registry killed with SIGKILL mid-ingest, PostgreSQL's
connections cut mid-ingest. No partial run is ever stored, the database stays whole, and
agents retrying their reports (the same run ids, as spools do) get every one stored once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url

from fleetbench.contract import wire
from fleetbench.registry import tokens
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import create_db_engine
from tests.factories import JSON, free_port, make_report, running_registry, wait_until_serving

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = [sys.executable, "-m", "fleetbench.registry.cli"]


def _whole(database_url: str, reports: list[wire.RunReport]) -> tuple[int, int]:
    """(runs stored, of which incomplete): a run stored without all its points, or missing
    from its node's run count, is a partial write."""
    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            runs = connection.execute(text("SELECT count(*) FROM runs")).scalar_one()
            short = connection.execute(
                text(
                    "SELECT count(*) FROM runs r WHERE"
                    " (SELECT count(*) FROM run_points p WHERE p.run_id = r.id) <> 6"
                )
            ).scalar_one()
            counted = connection.execute(
                text("SELECT coalesce(sum(run_count), 0) FROM node_activity")
            ).scalar_one()
    finally:
        engine.dispose()
    assert counted == runs, "node_activity counts every stored run"
    return runs, short


def _serve(database_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [*REGISTRY, "serve", "--port", str(port)],
        env={**os.environ, "FLEETBENCH_DATABASE_URL": database_url},
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    assert wait_until_serving(url, server).status_code == 200
    return server, url


def _tokens(database_url: str, nodes: int) -> list[str]:
    from fleetbench.registry.db import session_factory

    engine = create_db_engine(database_url)
    with session_factory(engine)() as session:
        secrets = [
            tokens.create_node_token(session, node_name=f"n{n}", labels={}) for n in range(nodes)
        ]
        session.commit()
    engine.dispose()
    return secrets


def _post_all(url: str, reports: list[wire.RunReport], tokens: list[str]) -> list[int | str]:
    def post(n: int) -> int | str:
        try:
            with httpx.Client(base_url=url, timeout=20) as client:
                return client.post(
                    "/v1/runs",
                    content=reports[n].model_dump_json(),
                    headers={**JSON, "Authorization": f"Bearer {tokens[n % len(tokens)]}"},
                ).status_code
        except httpx.TransportError as exc:
            return type(exc).__name__

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(post, range(len(reports))))


def test_a_registry_killed_mid_ingest_leaves_no_partial_run(database_url: str) -> None:
    tokens = _tokens(database_url, 8)
    reports = [make_report(node=f"n{n % 8}") for n in range(120)]
    server, url = _serve(database_url)
    killer = threading.Timer(0.4, lambda: os.killpg(server.pid, signal.SIGKILL))
    killer.start()
    first = _post_all(url, reports, tokens)
    killer.join()
    server.wait(timeout=30)
    assert any(isinstance(answer, str) for answer in first), "killed before all were answered"
    stored, partial = _whole(database_url, reports)
    assert partial == 0
    if database_url.startswith("sqlite"):
        path = make_url(database_url).database
        assert path is not None
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    server, url = _serve(database_url)  # restarted; every agent retries what it holds
    try:
        again = _post_all(url, reports, tokens)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert set(again) <= {200, 201}
    assert again.count(200) >= sum(1 for answer in first if answer == 201)
    assert _whole(database_url, reports) == (120, 0)
    assert stored <= 120


def test_connections_cut_mid_ingest_store_no_partial_run(postgres_database_url: str) -> None:
    """PostgreSQL terminates the registry's connections (as a restart does) while reports
    arrive: each is stored whole or answered 503; retried, every one is stored once."""
    url = make_url(postgres_database_url)
    reports = [make_report(node=f"n{n % 8}") for n in range(120)]
    admin = create_db_engine(url.set(database="postgres").render_as_string(hide_password=False))
    with running_registry(RegistrySettings(database_url=postgres_database_url)) as registry:
        tokens = [registry.token(f"n{n}") for n in range(8)]
        stop = threading.Event()

        def cut() -> None:
            with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                while not stop.wait(0.05):
                    connection.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE datname = :db AND pid <> pg_backend_pid()"
                        ),
                        {"db": url.database},
                    )

        cutter = threading.Thread(target=cut)
        cutter.start()
        try:
            first = _post_all(registry.url, reports, tokens)
        finally:
            stop.set()
            cutter.join()
        again = _post_all(registry.url, reports, tokens)
    admin.dispose()
    assert set(first) <= {201, 503}, set(first)
    assert 503 in first  # the cuts were felt
    assert set(again) <= {200, 201}
    assert _whole(postgres_database_url, reports) == (120, 0)


def test_readiness_says_unavailable_without_naming_the_database_and_liveness_holds(
    postgres_database_url: str,
) -> None:
    """The database gone, /readyz and /healthz answer 503 and keep its host, port and name
    (what the driver's error says) to the registry's log; /livez, which a liveness probe
    asks, still answers 200, so the outage restarts no registry."""
    url = make_url(postgres_database_url)
    admin = create_db_engine(url.set(database="postgres").render_as_string(hide_password=False))
    with running_registry(RegistrySettings(database_url=postgres_database_url)) as registry:
        assert httpx.get(f"{registry.url}/healthz").json()["status"] == "ok"
        registry.engine.dispose()  # the test's own connections, so the drop can go ahead
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text(f'DROP DATABASE "{url.database}" WITH (FORCE)'))
        down = httpx.get(f"{registry.url}/healthz")
        ready = httpx.get(f"{registry.url}/readyz")
        live = httpx.get(f"{registry.url}/livez")
    admin.dispose()
    assert (ready.status_code, ready.json()) == (down.status_code, down.json())
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert down.status_code == 503
    assert down.json()["detail"] == "the registry's database is unavailable"
    assert str(url.database) not in down.text and str(url.port or 5432) not in down.text
