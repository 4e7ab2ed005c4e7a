"""The process delivering the spool killed with SIGKILL, again and again, in the middle of
its deliveries: nothing is lost and nothing is stored twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetbench.agent.spool import Spool
from tests.factories import LiveRegistry, make_report


def test_a_flush_killed_six_times_loses_nothing_and_stores_nothing_twice(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    token = live_registry.token("m4pro")
    spool_path = tmp_path / "spool.db"
    spool = Spool(spool_path)
    reports = [make_report() for _ in range(100)]
    for report in reports:
        spool.add(report)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_")},
        "FLEETBENCH_SPOOL": str(spool_path),
        "FLEETBENCH_TOKEN": token,
    }
    command = [
        sys.executable,
        "-m",
        "fleetbench.agent.cli",
        "flush",
        "--registry",
        live_registry.url,
    ]
    killed_after_some = 0
    for attempt in range(6):
        before = spool.counts()["delivered"]
        flush = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        # Killed while it is delivering, a little later each time (counted in deliveries,
        # not seconds: a fast registry would otherwise see every run delivered first).
        deadline = time.monotonic() + 30
        while spool.counts()["delivered"] < before + 1 + 2 * attempt:
            assert time.monotonic() < deadline, "the flush delivered nothing for 30 s"
            time.sleep(0.005)
        flush.send_signal(signal.SIGKILL)
        flush.wait(timeout=30)
        killed_after_some += spool.counts()["delivered"] > before
    assert killed_after_some == 6
    assert spool.counts()["queued"] > 0, "the kills came before the end"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert spool.counts() == {"queued": 0, "delivered": 100, "rejected": 0}
    assert live_registry.count("runs") == 100
    assert live_registry.count("run_points") == 600
