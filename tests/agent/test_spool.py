"""The spool against a real registry on loopback: nothing lost, nothing duplicated."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fleetbench.agent import spool as spool_module
from fleetbench.agent.client import RegistryClient
from fleetbench.agent.config import AgentSettings
from fleetbench.agent.delivery import Delivery
from fleetbench.agent.errors import SpoolUnwritable
from fleetbench.agent.spool import Spool
from fleetbench.contract.wire import AgentIdentity
from fleetbench.registry.config import RegistrySettings
from tests.factories import LiveRegistry, free_port, make_report, running_registry

HOUR = 3600.0
NOW = 1_800_000_000.0


def test_registry_down_then_up_loses_nothing_and_duplicates_nothing(
    database_url: str, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool.db")
    reports = [make_report() for _ in range(3)]
    for report in reports:
        spool.add(report, now=NOW)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    with RegistryClient(down, token="unused") as client:
        first = spool.flush(client, now=NOW)
    assert (first.delivered, first.deferred) == (0, 3)
    assert spool.counts() == {"queued": 3, "delivered": 0, "rejected": 0}
    waiting = spool.runs("queued")
    assert sorted(r.attempts for r in waiting) == [0, 0, 1]  # one tried; the rest wait with it
    assert any("unreachable" in (r.last_error or "") for r in waiting)
    assert len({r.next_attempt_at for r in waiting}) == 1
    assert waiting[0].next_attempt_at >= NOW + 1

    with running_registry(RegistrySettings(database_url=database_url)) as registry:
        token = registry.token("m4pro")
        with RegistryClient(registry.url, token=token) as client:
            too_early = spool.flush(client, now=NOW)  # backoff not over: nothing sent
            later = spool.flush(client, now=NOW + 2 * HOUR)
            again = spool.flush(client, now=NOW + 3 * HOUR)
        assert (too_early.delivered, later.delivered, again.delivered) == (0, 3, 0)
        assert registry.count("runs") == 3
        assert registry.count("run_points") == 18
    assert spool.counts() == {"queued": 0, "delivered": 3, "rejected": 0}


def test_a_lost_acknowledgement_is_redelivered_harmlessly(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    token = live_registry.token("m4pro")
    report = make_report()
    with live_registry.client(token) as http:  # stored, but the agent never heard back
        assert (
            http.post(
                "/v1/runs",
                content=report.model_dump_json(),
                headers={"content-type": "application/json"},
            ).status_code
            == 201
        )
    spool = Spool(tmp_path / "spool.db")
    spool.add(report, now=NOW)
    with RegistryClient(live_registry.url, token=token) as client:
        assert spool.flush(client, now=NOW).delivered == 1
    assert live_registry.count("runs") == 1


def test_an_invalid_report_is_kept_aside_with_the_reason(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    token = live_registry.token("m4pro")
    spool = Spool(tmp_path / "spool.db")
    other_nodes = make_report(node="someone-else")
    good = make_report()
    spool.add(other_nodes, now=NOW)
    spool.add(good, now=NOW + 1)
    with RegistryClient(live_registry.url, token=token) as client:
        result = spool.flush(client, now=NOW + 2)
        assert spool.flush(client, now=NOW + 10 * HOUR).rejected == 0  # not retried
    assert (result.delivered, result.rejected) == (1, 1)
    [rejected] = spool.runs("rejected")
    assert rejected.run_id == str(other_nodes.run_id)
    assert "403" in (rejected.last_error or "")
    assert live_registry.count("runs") == 1


def test_a_wrong_token_is_retried_not_rejected(live_registry: LiveRegistry, tmp_path: Path) -> None:
    live_registry.token("m4pro")
    spool = Spool(tmp_path / "spool.db")
    spool.add(make_report(), now=NOW)
    with RegistryClient(live_registry.url, token="fbn_revoked") as client:
        result = spool.flush(client, now=NOW)
    assert (result.deferred, result.rejected) == (1, 0)
    assert spool.counts()["queued"] == 1


def test_a_5xx_defers_and_backs_off_exponentially(tmp_path: Path) -> None:
    # A registry answering 503 on demand: the one fault a real server will not produce.
    transport = httpx.MockTransport(lambda request: httpx.Response(503, text="maintenance"))
    spool = Spool(tmp_path / "spool.db")
    spool.add(make_report(), now=NOW)
    delays = []
    moment = NOW
    with RegistryClient("http://registry.invalid", token="t", transport=transport) as client:
        for _ in range(8):
            assert spool.flush(client, now=moment).deferred == 1
            [run] = spool.runs("queued")
            delays.append(run.next_attempt_at - moment)
            moment = run.next_attempt_at
    assert run.attempts == 8 and "503" in (run.last_error or "")
    assert all(1.0 <= d <= 3600.0 for d in delays)
    assert max(delays[4:]) > max(delays[:2])  # the window grows: 30 s, 60 s, ... up to 1 h


def test_the_same_run_is_spooled_once_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db")
    report = make_report()
    spool.add(report)
    spool.add(report)
    assert len(spool.runs()) == 1
    with pytest.raises(ValueError, match="already spooled with another report"):
        spool.add(report.model_copy(update={"error": "changed"}))


def test_a_run_sent_again_by_an_upgraded_agent_is_the_same_run(tmp_path: Path) -> None:
    """The agent that made a report is no part of the run: an import again after an upgrade
    queues the run once more (as importing again does), never "another report"."""
    spool = Spool(tmp_path / "spool.db")
    report = make_report(agent=AgentIdentity(version="0.1.0"))
    upgraded = report.model_copy(update={"agent": AgentIdentity(version="0.2.0")})
    spool.add(report, now=NOW)
    spool.add(upgraded, now=NOW + 1)  # a no-op: the run is spooled already
    with sqlite3.connect(tmp_path / "spool.db") as db:
        db.execute("UPDATE runs SET state = 'delivered'")
    spool.add(upgraded, now=NOW + 2, again=True)
    [run] = spool.runs()
    assert (run.state, run.spooled_at) == ("queued", NOW)
    with pytest.raises(ValueError, match="already spooled with another report"):
        spool.add(upgraded.model_copy(update={"error": "changed"}))


def test_status_command_shows_the_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "fleetbench" / "spool.db")
    spool.add(make_report(), now=NOW)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path), "COLUMNS": "200"}
    env.pop("FLEETBENCH_SPOOL", None)
    text = subprocess.run(
        [sys.executable, "-m", "fleetbench.agent.cli", "status"],
        env=env,
        capture_output=True,
        text=True,
    )
    as_json = subprocess.run(
        [sys.executable, "-m", "fleetbench.agent.cli", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert "1 queued, 0 delivered, 0 rejected" in text.stdout
    [run] = json.loads(as_json.stdout)
    assert (run["state"], run["attempts"]) == ("queued", 0)


def test_a_spool_locked_past_the_wait_cannot_be_written_and_the_run_is_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the spool's write lock longer than a write waits: the write is
    one SpoolUnwritable naming the lock, which every caller handles (the daemon keeps the run
    in memory; `sweep --report` prints it and delivers it itself), never a traceback."""
    monkeypatch.setattr(spool_module, "_BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "spool.db"
    spool = Spool(path)
    first, second = make_report(), make_report()
    spool.add(first, now=NOW)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SpoolUnwritable, match=r"cannot be written \(database is locked"):
            spool.add(second, now=NOW)
        delivery = Delivery(spool, AgentSettings())
        delivery.keep(second, "nightly")
        assert delivery.unspooled == [second]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    spool.add(second, now=NOW)
    assert [r.run_id for r in spool.runs()] == [str(first.run_id), str(second.run_id)]
