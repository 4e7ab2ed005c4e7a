"""The spool's delivery rules against real HTTP servers on loopback: a run answered 5xx does
not hold up the others and is set aside in the end; Retry-After is honoured; a spool file of a
format this agent does not read is refused untouched; delivered runs are pruned; the `flush`
and `status` commands."""

from __future__ import annotations

import json
import sqlite3
import time
from email.utils import formatdate
from pathlib import Path

import pytest

from fleetbench.agent.client import RegistryClient
from fleetbench.agent.errors import RegistryUnavailable, RequestRejected, SpoolError
from fleetbench.agent.spool import Spool, SpooledRun
from tests.agent.flaky_registry import Answer, flaky_registry
from tests.factories import LiveRegistry, agent, free_port, make_report

HOUR = 3600.0
DAY = 24 * HOUR
NOW = 1_800_000_000.0

# The runs table as development agents before 0.1.0 first made it (no format number).
DEVELOPMENT_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    report TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'delivered', 'rejected')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT,
    spooled_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS runs_due ON runs (state, next_attempt_at);
"""


def spool_of_another_format(path: Path, user_version: int = 0) -> bytes:
    """A spool as an agent of another format left it (0: a development agent before 0.1.0,
    which wrote no format number), one run queued; its bytes."""
    report = make_report()
    db = sqlite3.connect(path)
    db.executescript(DEVELOPMENT_SCHEMA)
    db.execute(f"PRAGMA user_version = {user_version}")
    db.execute(
        "INSERT INTO runs VALUES (?, ?, 'queued', 2, 0, 'timeout', 0, NULL)",
        (str(report.run_id), report.model_dump_json()),
    )
    db.commit()
    db.close()
    return path.read_bytes()


def _run(spool: Spool, run_id: object) -> SpooledRun:
    [run] = [r for r in spool.runs() if r.run_id == str(run_id)]
    return run


def test_a_run_answered_500_does_not_hold_up_the_runs_behind_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db")
    poison, *others = [make_report() for _ in range(3)]
    for offset, report in enumerate([poison, *others]):
        spool.add(report, now=NOW + offset)
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.fail(poison.run_id, 500)
        result = spool.flush(client, now=NOW + 10)
    assert registry.posted == [str(r.run_id) for r in (poison, *others)]
    assert (result.delivered, result.deferred, result.rejected) == (2, 1, 0)
    assert result.registry_down is False
    assert result.waiting_reason == "registry answered 500: boom"
    waiting = _run(spool, poison.run_id)
    assert (waiting.state, waiting.attempts, waiting.server_errors) == ("queued", 1, 1)
    assert waiting.first_failed_at == NOW + 10
    assert NOW + 11 <= waiting.next_attempt_at <= NOW + 10 + 30
    assert spool.counts() == {"queued": 1, "delivered": 2, "rejected": 0}


def test_a_run_answered_500_again_and_again_is_set_aside_and_kept(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db", set_aside_after_5xx=3)
    poison = make_report()
    spool.add(poison, now=NOW)
    moment = NOW
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.fail(poison.run_id, 500)
        for flush in range(3):
            newcomer = make_report()
            spool.add(newcomer, now=moment + 1)  # spooled after the failing run
            result = spool.flush(client, now=moment + 1)
            assert result.delivered == 1
            # after its first 5xx the failing run goes after the others
            expected = [poison, newcomer] if flush == 0 else [newcomer, poison]
            assert registry.posted[-2:] == [str(r.run_id) for r in expected]
            moment = _run(spool, poison.run_id).next_attempt_at
        assert (result.rejected, result.deferred) == (1, 0)
        tried = len(registry.posted)
        assert spool.flush(client, now=moment + DAY).rejected == 0
        assert len(registry.posted) == tried  # set aside: not tried again
    aside = _run(spool, poison.run_id)
    assert (aside.state, aside.server_errors, aside.attempts) == ("rejected", 3, 3)
    assert aside.last_error == (
        "set aside after 3 answers of 5xx while the registry accepted other runs: "
        "registry answered 500: boom"
    )
    assert spool.counts() == {"queued": 0, "delivered": 3, "rejected": 1}  # nothing deleted


def test_500s_while_no_other_run_is_delivered_are_not_held_against_the_run(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool.db", set_aside_after_5xx=2)
    report = make_report()
    spool.add(report, now=NOW)
    moment = NOW
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.fail(report.run_id, 502, "bad gateway")
        for _ in range(4):
            assert spool.flush(client, now=moment).deferred == 1
            moment = _run(spool, report.run_id).next_attempt_at
    run = _run(spool, report.run_id)
    assert (run.state, run.attempts, run.server_errors) == ("queued", 4, 0)
    assert run.last_error == "registry answered 502: bad gateway"


def test_two_failures_in_a_row_stop_the_flush_and_the_rest_wait(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db")
    first, second, third = [make_report() for _ in range(3)]
    for offset, report in enumerate([first, second, third]):
        spool.add(report, now=NOW + offset)
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.fail(first.run_id, 500)
        registry.fail(second.run_id, 503)  # no Retry-After: a 5xx like any other
        result = spool.flush(client, now=NOW + 10)
    assert registry.posted == [str(first.run_id), str(second.run_id)]  # third never sent
    assert (result.delivered, result.deferred, result.registry_down) == (0, 3, True)
    runs = {r.run_id: r for r in spool.runs()}
    behind = runs[str(third.run_id)]
    assert behind.attempts == 0
    assert behind.next_attempt_at == runs[str(second.run_id)].next_attempt_at >= NOW + 11
    # nothing was delivered: the registry is unwell, the runs are not to blame
    assert [r.server_errors for r in runs.values()] == [0, 0, 0]


def test_a_run_failing_for_longer_than_the_limit_is_set_aside_whatever_the_cause(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool.db", set_aside_after_attempts=3, set_aside_after_s=HOUR)
    report = make_report()
    spool.add(report, now=NOW)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with RegistryClient(down, token="t") as client:
        assert spool.flush(client, now=NOW).deferred == 1
        late = spool.flush(client, now=NOW + 2 * HOUR)  # past the limit, only 2 attempts
        assert (late.deferred, late.rejected) == (1, 0)
        last = spool.flush(client, now=NOW + 3 * HOUR)
    assert (last.deferred, last.rejected) == (0, 1)
    aside = _run(spool, report.run_id)
    assert (aside.state, aside.attempts, aside.first_failed_at) == ("rejected", 3, NOW)
    assert (aside.last_error or "").startswith(
        f"set aside after 3 failed attempts over 3.0 h: registry at {down} unreachable"
    )


# What a registry answers a report of a wire version it does not read (its validation error,
# as tests/agent/test_serving.py has a live registry give it).
VERSION_REFUSED = json.dumps(
    {
        "detail": [
            {
                "type": "value_error",
                "loc": ["body", "schema_version"],
                "msg": "Value error, schema version 6 is newer than this registry's (5): "
                "upgrade the registry",
                "input": 6,
            }
        ]
    }
)


def test_a_run_the_registry_refuses_for_its_wire_version_waits_for_an_upgrade(
    tmp_path: Path,
) -> None:
    """Not the run's fault: one side is yet to be upgraded. The run backs off, queued; any
    other 422 sets a run aside."""
    spool = Spool(tmp_path / "spool.db")
    waiting, wrong = make_report(), make_report()
    spool.add(waiting, now=NOW)
    spool.add(wrong, now=NOW + 1)
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.fail(waiting.run_id, 422, VERSION_REFUSED)
        registry.fail(wrong.run_id, 422, '{"detail": [{"loc": ["body", "node"], "msg": "no"}]}')
        result = spool.flush(client, now=NOW + 10)
        assert (result.rejected, result.deferred) == (1, 1)
        queued = _run(spool, waiting.run_id)
        assert (queued.state, queued.attempts) == ("queued", 1)
        assert "upgrade the registry" in (queued.last_error or "")
        assert _run(spool, wrong.run_id).state == "rejected"
        registry.failing.clear()  # the registry upgraded
        assert spool.flush(client, now=queued.next_attempt_at).delivered == 1


@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_is_honoured_and_the_rest_wait_as_long(tmp_path: Path, status: int) -> None:
    spool = Spool(tmp_path / "spool.db")
    first, second = make_report(), make_report()
    spool.add(first, now=NOW)
    spool.add(second, now=NOW + 1)
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.every_run = Answer(status, "busy: retry later", retry_after="120")
        result = spool.flush(client, now=NOW + 10)
        assert registry.posted == [str(first.run_id)]  # one answer said it: quiet
        assert spool.flush(client, now=NOW + 10 + 119).deferred == 0  # not due yet
        assert registry.posted == [str(first.run_id)]
    assert (result.deferred, result.registry_down) == (2, False)
    asked, behind = _run(spool, first.run_id), _run(spool, second.run_id)
    assert NOW + 130 <= asked.next_attempt_at <= NOW + 130 + 60  # plus jitter
    assert behind.next_attempt_at == asked.next_attempt_at
    assert (asked.attempts, asked.server_errors, behind.attempts) == (1, 0, 0)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("120", 120.0), ("0", 0.0), ("soon", None), (None, None), ("86400000", 3600.0)],
)
def test_the_client_reads_retry_after(header: str | None, expected: float | None) -> None:
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.every_run = Answer(503, "shedding load", retry_after=header)
        with pytest.raises(RegistryUnavailable) as unavailable:
            client.submit_run(make_report())
    assert (unavailable.value.status_code, unavailable.value.retry_after) == (503, expected)
    assert str(unavailable.value) == "registry answered 503: shedding load"


def test_the_client_reads_retry_after_as_a_date_and_on_429() -> None:
    in_90_s = formatdate(time.time() + 90, usegmt=True)
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.every_run = Answer(429, '{"detail": "slow down"}', retry_after=in_90_s)
        with pytest.raises(RequestRejected) as rejected:
            client.submit_run(make_report())
    assert rejected.value.status_code == 429
    assert rejected.value.retry_after is not None and 85 <= rejected.value.retry_after <= 90
    with (
        RegistryClient(f"http://127.0.0.1:{free_port()}") as client,
        pytest.raises(RegistryUnavailable) as no_answer,
    ):
        client.submit_run(make_report())
    assert (no_answer.value.status_code, no_answer.value.retry_after) == (None, None)


def test_healthy_asks_healthz(live_registry: LiveRegistry) -> None:
    with RegistryClient(live_registry.url) as client:
        assert client.healthy() is True
    with flaky_registry() as registry, RegistryClient(registry.url) as client:
        registry.healthy = False
        assert client.healthy() is False
        registry.healthy = True
        assert client.healthy() is True
        assert registry.health_checks == 2
    with RegistryClient(f"http://127.0.0.1:{free_port()}") as client:
        assert client.healthy() is False


@pytest.mark.parametrize(
    ("user_version", "made_by"),
    [(0, "a development agent before fleetbench 0.1.0"), (2, "an agent newer than this one")],
)
def test_a_spool_of_a_format_this_agent_does_not_read_is_refused_and_left_as_it_was(
    tmp_path: Path, user_version: int, made_by: str
) -> None:
    path = tmp_path / "spool.db"
    before = spool_of_another_format(path, user_version)

    with pytest.raises(SpoolError) as refused:
        Spool(path)
    assert f"is in format {user_version}, made by {made_by}" in str(refused.value)
    assert "this agent reads format 1" in str(refused.value)
    status = agent("status", FLEETBENCH_SPOOL=str(path))
    assert status.returncode == 1
    assert status.stderr.startswith(f"error: the spool at {path} is in format {user_version}")
    assert "Traceback" not in status.stderr
    assert path.read_bytes() == before


def test_a_new_spool_says_its_format_and_opening_it_again_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    Spool(path).add(make_report(), now=NOW)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (1,)
    before = path.stat().st_mtime_ns
    assert Spool(path).counts()["queued"] == 1
    assert path.stat().st_mtime_ns == before


def test_delivered_runs_are_pruned_after_the_retention_and_nothing_else(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db", keep_delivered_s=7 * DAY)
    old, refused, unauthorised, recent = [make_report() for _ in range(4)]
    for report in (old, refused, unauthorised):
        spool.add(report, now=NOW)
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        registry.fail(refused.run_id, 422, '{"detail": "points: too few"}')
        registry.fail(unauthorised.run_id, 401, '{"detail": "unknown token"}')
        spool.flush(client, now=NOW)
        spool.add(recent, now=NOW + 6 * DAY)
        spool.flush(client, now=NOW + 6 * DAY)
        assert len(spool.runs()) == 4
        spool.flush(client, now=NOW + 7 * DAY + 1)
    states = {r.run_id: r.state for r in spool.runs()}
    assert states == {
        str(refused.run_id): "rejected",
        str(unauthorised.run_id): "queued",
        str(recent.run_id): "delivered",
    }


def test_flush_command_delivers_every_queued_run_now(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    path = tmp_path / "spool.db"
    spool = Spool(path)
    for report in (make_report(), make_report(), make_report(node="someone-else")):
        spool.add(report)
    with RegistryClient(f"http://127.0.0.1:{free_port()}") as client:
        spool.flush(client)  # the registry was down: the runs back off
    assert all(r.next_attempt_at > time.time() for r in spool.runs())

    done = agent(
        "flush",
        "--registry",
        live_registry.url,
        FLEETBENCH_SPOOL=str(path),
        FLEETBENCH_TOKEN=live_registry.token("m4pro"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2 delivered, 1 rejected, 0 still waiting"
    assert live_registry.count("runs") == 2
    assert spool.counts() == {"queued": 0, "delivered": 2, "rejected": 1}


def test_flush_command_says_why_runs_still_wait_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    Spool(path).add(make_report())
    down = f"http://127.0.0.1:{free_port()}"
    done = agent("flush", "--registry", down, FLEETBENCH_SPOOL=str(path))
    assert done.returncode == 1
    assert done.stdout.startswith(
        f"0 delivered, 0 rejected, 1 still waiting: registry at {down} unreachable: "
    )
    assert "Traceback" not in done.stderr


def test_flush_command_prunes_delivered_runs_past_the_retention_setting(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = Spool(path)
    spool.add(make_report(), now=time.time() - 3 * DAY)
    with flaky_registry() as registry:
        with RegistryClient(registry.url) as client:
            spool.flush(client, now=time.time() - 2 * DAY)
        kept = agent("flush", "--registry", registry.url, FLEETBENCH_SPOOL=str(path))
        assert (kept.returncode, spool.counts()["delivered"]) == (0, 1)  # 7 days by default
        pruned = agent(
            "flush",
            "--registry",
            registry.url,
            FLEETBENCH_SPOOL=str(path),
            FLEETBENCH_SPOOL_RETENTION_DAYS="1",
        )
    assert pruned.returncode == 0, pruned.stderr
    assert spool.counts()["delivered"] == 0
    bad = agent("flush", FLEETBENCH_SPOOL=str(path), FLEETBENCH_SPOOL_RETENTION_DAYS="soon")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: FLEETBENCH_SPOOL_RETENTION_DAYS: ")


def test_status_shows_set_aside_runs_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = Spool(path, set_aside_after_5xx=1)
    poison, good = make_report(), make_report()
    spool.add(poison, now=NOW)
    spool.add(good, now=NOW + 1)
    with flaky_registry() as registry, RegistryClient(registry.url) as client:
        registry.fail(poison.run_id, 500, "internal error")
        spool.flush(client, now=NOW + 10)

    text = agent("status", FLEETBENCH_SPOOL=str(path))
    as_json = agent("status", "--json", FLEETBENCH_SPOOL=str(path))
    assert text.returncode == 0, text.stderr
    assert "0 queued, 1 delivered, 1 rejected" in text.stdout
    assert str(poison.run_id) in text.stdout
    assert "set aside after 1 answers of 5xx" in text.stdout
    runs = {r["run_id"]: r for r in json.loads(as_json.stdout)}
    aside = runs[str(poison.run_id)]
    assert (aside["state"], aside["server_errors"], aside["first_failed_at"]) == (
        "rejected",
        1,
        NOW + 10,
    )
    assert aside["last_error"] == (
        "set aside after 1 answers of 5xx while the registry accepted other runs: "
        "registry answered 500: internal error"
    )
    assert runs[str(good.run_id)]["state"] == "delivered"


def test_a_spooled_run_that_no_longer_validates_is_set_aside(tmp_path: Path) -> None:
    """A row the contract does not read (here: a NUL in the error, which no registry stores):
    set aside with the reason, and the runs behind it delivered."""
    spool = Spool(tmp_path / "spool.db")
    stale, fresh = make_report(), make_report()
    spool.add(stale, now=NOW)
    spool.add(fresh, now=NOW + 1)
    body = json.loads(stale.model_dump_json())
    body["error"] = "boom\u0000"
    with sqlite3.connect(tmp_path / "spool.db") as db:
        db.execute(
            "UPDATE runs SET report = ? WHERE run_id = ?", (json.dumps(body), str(stale.run_id))
        )
    with flaky_registry() as registry, RegistryClient(registry.url, token="t") as client:
        result = spool.flush(client, now=NOW + 10)
    assert registry.posted == [str(fresh.run_id)]
    assert (result.delivered, result.rejected, result.deferred) == (1, 1, 0)
    aside = _run(spool, stale.run_id)
    assert aside.state == "rejected"
    assert aside.last_error is not None and "not a valid report" in aside.last_error
    assert "error" in aside.last_error
