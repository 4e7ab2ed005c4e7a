"""Admission: a burst is answered at once, 201 or 503 with a Retry-After, never left to time
out; nothing answered 503 is stored and nothing answered 201 is lost; a database that is down
is a 503 too. And the lanes themselves, on a real event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from fleetbench.registry.admission import Lane, LaneLimits
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import create_db_engine, upgrade_schema
from tests.factories import JSON, make_report, running_registry

# --- the lanes -----------------------------------------------------------------------------


def test_a_lane_admits_its_limit_queues_in_order_and_refuses_beyond_its_queue() -> None:
    async def scenario() -> list[str]:
        lane = Lane("write", LaneLimits(in_flight=2, queued=2, max_wait_s=5))
        order: list[str] = []
        assert await lane.enter() and await lane.enter()  # both slots taken

        async def waits(name: str) -> None:
            assert await lane.enter()
            order.append(name)

        first, second = asyncio.create_task(waits("first")), asyncio.create_task(waits("second"))
        await asyncio.sleep(0.01)
        assert lane.waiting == 2
        assert not await lane.enter()  # queue full: refused at once
        lane.leave()
        lane.leave()
        await asyncio.gather(first, second)
        lane.leave()
        lane.leave()
        assert (lane.active, lane.waiting) == (0, 0)
        return order

    assert asyncio.run(scenario()) == ["first", "second"]


def test_a_wait_past_its_limit_is_refused_and_frees_its_place() -> None:
    async def scenario() -> tuple[bool, float, int, int]:
        lane = Lane("read", LaneLimits(in_flight=1, queued=5, max_wait_s=0.05))
        assert await lane.enter()
        began = time.monotonic()
        admitted = await lane.enter()
        waited = time.monotonic() - began
        lane.leave()
        return admitted, waited, lane.active, lane.waiting

    admitted, waited, active, waiting = asyncio.run(scenario())
    assert not admitted
    assert 0.04 < waited < 1
    assert (active, waiting) == (0, 0)


def test_a_client_gone_while_waiting_leaves_no_slot_behind() -> None:
    async def scenario() -> tuple[int, int, bool]:
        lane = Lane("write", LaneLimits(in_flight=1, queued=5, max_wait_s=5))
        assert await lane.enter()
        waiter = asyncio.create_task(lane.enter())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        lane.leave()
        return lane.active, lane.waiting, await lane.enter()

    assert asyncio.run(scenario()) == (0, 0, True)


# --- a live registry -------------------------------------------------------------------------


def test_a_burst_is_answered_at_once_and_the_database_holds_exactly_the_201s(
    database_url: str,
) -> None:
    settings = RegistrySettings(
        database_url=database_url,
        max_writes_in_flight=4,
        max_queued=4,
        max_queue_wait_s=0.5,
        retry_after_s=3,
    )
    with running_registry(settings) as registry:
        tokens = [registry.token(f"node-{n}") for n in range(60)]
        reports = [make_report(node=f"node-{n}") for n in range(60)]

        def post(n: int) -> tuple[int, str | None, float]:
            began = time.monotonic()
            with httpx.Client(base_url=registry.url, timeout=30) as client:
                response = client.post(
                    "/v1/runs",
                    content=reports[n].model_dump_json(),
                    headers={**JSON, "Authorization": f"Bearer {tokens[n]}"},
                )
            return (
                response.status_code,
                response.headers.get("retry-after"),
                time.monotonic() - began,
            )

        with ThreadPoolExecutor(60) as pool:
            answers = list(pool.map(post, range(60)))
        created = [n for n, (status, _, _) in enumerate(answers) if status == 201]
        shed = [(retry, took) for status, retry, took in answers if status == 503]
        assert {status for status, _, _ in answers} <= {201, 503}
        assert created and shed
        assert all(retry is not None and 3 <= int(retry) <= 6 for retry, _ in shed)
        assert max(took for _, _, took in answers) < 15
        with registry.engine.connect() as connection:
            stored = {str(row[0]) for row in connection.execute(text("SELECT id FROM runs"))}
        assert len(stored) == len(created)
        assert {str(reports[n].run_id).replace("-", "") for n in created} == {
            s.replace("-", "") for s in stored
        }


def test_a_postgresql_that_refuses_connections_is_a_503_then_recovers(
    postgres_database_url: str,
) -> None:
    url = make_url(postgres_database_url)
    admin = create_db_engine(url.set(database="postgres").render_as_string(hide_password=False))
    with running_registry(RegistrySettings(database_url=postgres_database_url)) as registry:
        token = registry.token("m4pro")
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS false'))
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": url.database},
            )
            try:
                with registry.client(token) as client:
                    down = client.post(
                        "/v1/runs", content=make_report().model_dump_json(), headers=JSON
                    )
                    nodes = client.get("/v1/nodes")
            finally:
                connection.execute(text(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS true'))
        with registry.client(token) as client:
            up = client.post("/v1/runs", content=make_report().model_dump_json(), headers=JSON)
            stored = registry.count("runs")
    admin.dispose()
    assert down.status_code == 503, down.text
    assert int(down.headers["retry-after"]) >= 1
    assert nodes.status_code == 503
    assert up.status_code == 201
    assert stored == 1  # the report answered 503 is not stored; the next one is


def test_a_sqlite_file_another_process_holds_locked_is_a_503(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    settings = RegistrySettings(database_url=f"sqlite:///{path}")
    engine = create_db_engine(settings.sqlalchemy_url)
    upgrade_schema(engine)
    engine.dispose()
    with running_registry(settings) as registry:
        token = registry.token("m4pro")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with registry.client(token) as client:
                locked = client.post(
                    "/v1/runs", content=make_report().model_dump_json(), headers=JSON
                )
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        with registry.client(token) as client:
            free = client.post("/v1/runs", content=make_report().model_dump_json(), headers=JSON)
    assert locked.status_code == 503, locked.text
    assert locked.headers["retry-after"]
    assert free.status_code == 201
