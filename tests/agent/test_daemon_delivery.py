"""The daemon's deliveries: it tries at once when the registry answers again, not for a run
only it keeps failing; its flush job has jitter; its settings reach the spool."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetbench.agent.config import AgentSettings
from fleetbench.agent.daemon import Daemon, load_config
from tests.agent.flaky_registry import flaky_registry
from tests.factories import LiveRegistry, a_daemon, free_port, make_report


def _daemon(tmp_path: Path, registry_url: str, **agent: object) -> Daemon:
    sweep = {"name": "tiny", "model": tmp_path / "none.gguf", "cron": "0 3 * * *"}
    return a_daemon(tmp_path, sweep, **{"registry_url": registry_url, "token": "t", **agent})


@pytest.fixture
def widest_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff at the top of its window: a first retry exactly 30 s later."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)


@pytest.mark.usefixtures("widest_jitter")
def test_the_daemon_delivers_at_once_when_the_registry_answers_again(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, f"http://127.0.0.1:{free_port()}")  # down
    waiting, behind = make_report(node="ci-node"), make_report(node="ci-node")
    daemon.spool.add(waiting)
    daemon.spool.add(behind)
    daemon.flush()
    assert daemon.spool.counts()["queued"] == 2
    [first, *_] = daemon.spool.runs("queued")
    with flaky_registry() as registry:
        daemon.registry_url = registry.url  # the registry is back, the backoff is not over
        daemon.flush()
        assert registry.health_checks == 1
        assert registry.posted == [str(waiting.run_id), str(behind.run_id)]
    assert first.attempts == 1 and first.next_attempt_at > first.spooled_at + 29
    assert daemon.spool.counts() == {"queued": 0, "delivered": 2, "rejected": 0}


@pytest.mark.usefixtures("widest_jitter")
def test_a_run_only_the_daemon_keeps_failing_waits_out_its_backoff(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, "unused")
    poison, good = make_report(node="ci-node"), make_report(node="ci-node")
    daemon.spool.add(poison)
    daemon.spool.add(good)
    with flaky_registry() as registry:
        registry.fail(poison.run_id, 500)
        daemon.registry_url = registry.url
        daemon.flush()  # good delivered: the registry is up, the poison run backs off
        daemon.flush()  # nothing due: no probe, no attempt
        assert registry.posted == [str(poison.run_id), str(good.run_id)]
        assert registry.health_checks == 0
    [run] = daemon.spool.runs("queued")
    assert (run.run_id, run.attempts, run.server_errors) == (str(poison.run_id), 1, 1)


@pytest.mark.usefixtures("widest_jitter")
def test_the_daemon_waits_while_the_registry_is_unhealthy(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, "unused")
    report = make_report(node="ci-node")
    daemon.spool.add(report)
    with flaky_registry() as registry:
        daemon.registry_url = f"http://127.0.0.1:{free_port()}"
        daemon.flush()  # down: backs off
        daemon.registry_url = registry.url
        registry.healthy = False
        daemon.flush()
        assert (registry.health_checks, registry.posted) == (1, [])
    assert daemon.spool.counts()["queued"] == 1


def test_the_flush_job_has_jitter(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, "unused", flush_every_s=60)
    daemon.schedule()
    job = daemon.scheduler.get_job("flush")
    assert (job.trigger.interval.total_seconds(), job.trigger.jitter) == (60, 15)


def test_the_set_aside_settings_and_the_retention_reach_the_spool(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        "[agent]\nset_aside_after_5xx = 2\nset_aside_after_attempts = 7\n"
        f'set_aside_after_hours = 1.5\nspool_retention_days = 3\nspool = "{tmp_path}/spool.db"\n\n'
        '[[sweep]]\nname = "tiny"\nmodel = "/models/tiny.gguf"\ncron = "0 3 * * *"\n'
    )
    spool = Daemon(load_config(path)).spool
    assert spool.path == tmp_path / "spool.db"
    assert (spool.set_aside_after_5xx, spool.set_aside_after_attempts) == (2, 7)
    assert (spool.set_aside_after_s, spool.keep_delivered_s) == (5400, 3 * 86400)


def test_the_daemon_reads_its_token_file_again_before_each_delivery(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    """An admin rotates the node's token, the old one ending at once, and the file is
    rewritten: the running daemon delivers its next run with the new token."""
    token_file = tmp_path / "token"
    token_file.write_text(live_registry.token("ci-node") + "\n")
    daemon = _daemon(tmp_path, live_registry.url, token=None, token_file=token_file)
    daemon.spool.add(make_report(node="ci-node"))
    daemon.flush()
    assert daemon.spool.counts()["delivered"] == 1
    with live_registry.client(live_registry.scoped_token("admin")) as admin:
        [old] = [t["id"] for t in admin.get("/v1/tokens").json()["data"] if t["node"]]
        new = admin.post(f"/v1/tokens/{old}/rotate", json={"grace_hours": 0}).json()["token"]
    token_file.write_text(new)
    daemon.spool.add(make_report(node="ci-node"))
    daemon.flush()
    assert daemon.spool.counts() == {"queued": 0, "delivered": 2, "rejected": 0}


def test_a_token_and_a_token_file_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="give token or token_file, not both"):
        AgentSettings(token="fbn_x", token_file=tmp_path / "token")
