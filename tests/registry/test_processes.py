"""More than one registry process: migrations started together, `serve --workers 2` on one
PostgreSQL database (every report stored once, /metrics counting all the workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from fleetbench.registry.db import create_db_engine, schema_revisions
from tests.factories import JSON, free_port, make_report, wait_until_serving

REGISTRY = [sys.executable, "-m", "fleetbench.registry.cli"]
ROOT = Path(__file__).resolve().parents[2]


def test_registries_migrating_together_all_succeed(empty_database_url: str) -> None:
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": empty_database_url}
    migrations = [
        subprocess.Popen(
            [*REGISTRY, "migrate"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outcomes = []
    for migration in migrations:
        _, err = migration.communicate(timeout=120)
        outcomes.append((migration.returncode, err))
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
    assert sum("schema upgraded from empty" in err for _, err in outcomes) == 1
    assert sum("schema already at" in err for _, err in outcomes) == 2
    engine = create_db_engine(empty_database_url)
    try:
        current, head = schema_revisions(engine)
        with engine.connect() as connection:
            versions = connection.execute(text("SELECT count(*) FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    assert current == head
    assert versions == 1


def _ingested(client: httpx.Client) -> float:
    families = text_string_to_metric_families(client.get("/metrics").text)
    return sum(
        sample.value
        for family in families
        if family.name == "fleetbench_ingest_runs"
        for sample in family.samples
        if sample.name == "fleetbench_ingest_runs_total" and sample.labels["outcome"] == "created"
    )


def test_two_workers_store_every_report_once_and_count_them_all(
    postgres_database_url: str,
) -> None:
    database_url = postgres_database_url
    port = free_port()
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": database_url}
    tokens = []
    for n in range(8):
        made = subprocess.run(
            [*REGISTRY, "token", "create", "--node", f"node-{n}"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        tokens.append(made.stdout.strip())
    server = subprocess.Popen(
        [*REGISTRY, "serve", "--port", str(port), "--workers", "2"],
        env=env,
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until_serving(url, server).status_code == 200
        reports = [make_report(node=f"node-{n % 8}") for n in range(48)]

        def post(n: int) -> int:
            with httpx.Client(base_url=url, timeout=30) as client:  # a connection each
                return client.post(
                    "/v1/runs",
                    content=reports[n].model_dump_json(),
                    headers={**JSON, "Authorization": f"Bearer {tokens[n % 8]}"},
                ).status_code

        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(post, range(48)))
        scrapes = []
        for _ in range(6):  # fresh connections: the workers take turns answering
            with httpx.Client(base_url=url, timeout=30) as client:
                scrapes.append(_ingested(client))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert statuses == [201] * 48
    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM runs")).scalar() == 48
    finally:
        engine.dispose()
    assert scrapes == [48.0] * 6
