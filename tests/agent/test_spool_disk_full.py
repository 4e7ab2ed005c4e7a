"""A spool the agent cannot use. A full disk, for real: a 2 MiB tmpfs filled to ENOSPC. The
spool stays readable and says the disk is full; `status`, `flush` and `sweep --report` give
one line, never a traceback, and lose nothing; the daemon starts, keeps an unspoolable run
in memory and in its log, and spools it once space is back. Mounting needs root: these
tests fail without it. And a spool of a format this agent does not read (a development
agent's): `sweep --report` delivers straight to the registry, the daemon will not start.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetbench.agent.errors import SpoolUnwritable
from fleetbench.agent.spool import Spool
from fleetbench.contract.wire import RunReport
from tests.agent.test_spool_delivery import spool_of_another_format
from tests.factories import LiveRegistry, a_daemon, agent, free_port, make_report

FULL = r"the spool at {path} cannot be written \(disk full: (\d+) bytes free\)"


class SmallDisk:
    """A mounted tmpfs of 2 MiB that `fill` fills to the last byte and `free` empties."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._filler = root / "filler"

    def fill(self) -> None:
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for chunk in (b"\0" * 65536, b"\0"):
                try:
                    while True:
                        os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)
        assert shutil.disk_usage(self.root).free == 0

    def free(self) -> None:
        self._filler.unlink()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    root = tmp_path / "small-disk"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"cannot mount a 2 MiB tmpfs at {root} (these tests need root): "
            f"{mounted.stderr.strip() or mounted.returncode}"
        )
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", str(root)], check=True)


def _full(path: Path) -> str:
    return FULL.format(path=re.escape(str(path)))


def test_a_full_disk_keeps_the_spool_readable_and_add_says_so(small_disk: SmallDisk) -> None:
    path = small_disk.root / "spool.db"
    before = make_report()
    Spool(path).add(before)
    small_disk.fill()

    spool = Spool(path)  # opens: the schema is there, nothing to write
    assert [r.run_id for r in spool.runs()] == [str(before.run_id)]
    assert spool.counts() == {"queued": 1, "delivered": 0, "rejected": 0}
    with pytest.raises(SpoolUnwritable, match=_full(path)) as full:
        spool.add(make_report())
    assert full.value.free_bytes == spool.free_bytes() < 4096
    assert spool.unwritable_reason() == str(full.value)

    small_disk.free()
    after = make_report()
    spool.add(after)
    assert spool.unwritable_reason() is None
    assert [r.run_id for r in spool.runs()] == [str(before.run_id), str(after.run_id)]


def test_a_spool_first_made_on_a_full_disk_opens_and_says_so(small_disk: SmallDisk) -> None:
    small_disk.fill()
    spool = Spool(small_disk.root / "state" / "spool.db")
    assert spool.runs() == []
    with pytest.raises(SpoolUnwritable, match="disk full"):
        spool.add(make_report())
    small_disk.free()
    spool.add(make_report())
    assert spool.counts()["queued"] == 1


def test_status_and_flush_on_a_full_disk_read_the_spool_and_say_so(
    small_disk: SmallDisk,
) -> None:
    path = small_disk.root / "spool.db"
    report = make_report()
    Spool(path).add(report)
    small_disk.fill()
    env = {"FLEETBENCH_SPOOL": str(path)}

    text = agent("status", **env)
    as_json = agent("status", "--json", **env)
    flushed = agent("flush", "--registry", f"http://127.0.0.1:{free_port()}", **env)

    assert text.returncode == 0, text.stderr
    assert "1 queued, 0 delivered, 0 rejected" in text.stdout
    assert re.search(f"warning: {_full(path)}", text.stdout)
    assert str(report.run_id) in text.stdout
    assert as_json.returncode == 0, as_json.stderr
    assert [r["run_id"] for r in json.loads(as_json.stdout)] == [str(report.run_id)]
    assert re.fullmatch(f"warning: {_full(path)}\n", as_json.stderr)
    assert flushed.returncode == 3
    assert re.fullmatch(f"error: {_full(path)}", flushed.stderr.strip())
    for done in (text, as_json, flushed):
        assert "Traceback" not in done.stderr + done.stdout
        assert "disk I/O error" not in done.stderr + done.stdout


def _sweep_report(
    tiny_llama: Path, registry: str, spool: Path, cache: Path, token: str
) -> subprocess.CompletedProcess[str]:
    """`sweep --report` of the tiny model, one point (about a second of llama.cpp)."""
    return agent(
        "sweep",
        "-m",
        str(tiny_llama),
        "--npp",
        "8",
        "--ntg",
        "4",
        "--npl",
        "1",
        "-c",
        "256",
        "--report",
        "--registry",
        registry,
        "--token",
        token,
        FLEETBENCH_SPOOL=str(spool),
        FLEETBENCH_CACHE_DIR=str(cache),
        FLEETBENCH_NODE="ci-node",
        FLEETBENCH_TOKEN="not this one: --token is",
    )


def test_sweep_report_on_a_full_disk_prints_the_run_and_one_line(
    small_disk: SmallDisk, tiny_llama: Path, tmp_path: Path
) -> None:
    path = small_disk.root / "spool.db"
    earlier = make_report()
    Spool(path).add(earlier)
    small_disk.fill()
    down = f"http://127.0.0.1:{free_port()}"

    done = _sweep_report(tiny_llama, down, path, tmp_path / "cache", "unused")

    assert done.returncode == 3, done.stderr
    run = RunReport.model_validate_json(done.stdout)  # `> run.json` keeps it
    assert (run.status, run.node, [p.b for p in run.points]) == ("ok", "ci-node", [1])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert re.fullmatch(
        f"error: {_full(path)}, and the registry did not take the run directly "
        rf"\(registry at {re.escape(down)} unreachable: .*\); "
        "the run is printed on stdout as JSON",
        errors[0],
    )
    assert "Traceback" not in done.stderr
    small_disk.free()
    assert [r.run_id for r in Spool(path).runs()] == [str(earlier.run_id)]  # intact


def test_sweep_report_with_a_development_agent_s_spool_delivers_directly(
    tiny_llama: Path, tmp_path: Path, live_registry: LiveRegistry
) -> None:
    path = tmp_path / "spool.db"
    before = spool_of_another_format(path)

    done = _sweep_report(
        tiny_llama, live_registry.url, path, tmp_path / "cache", live_registry.token("ci-node")
    )

    assert done.returncode == 0, done.stderr
    run = RunReport.model_validate_json(done.stdout)
    assert f"warning: the spool at {path} is in format 0, made by a development agent" in (
        done.stderr
    )
    assert f"run {run.run_id} was delivered to {live_registry.url} directly" in done.stderr
    assert live_registry.count("runs") == 1
    assert path.read_bytes() == before


def test_the_daemon_will_not_start_on_a_development_agent_s_spool(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    before = spool_of_another_format(path)
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nnode = "ci-node"\nregistry_url = "http://127.0.0.1:{free_port()}"\n'
        f'spool = "{path}"\n\n[[sweep]]\nname = "s"\nmodel = "{tmp_path / "m.gguf"}"\n'
        'cron = "0 3 * * *"\n'
    )
    done = agent("daemon", "--config", str(config), FLEETBENCH_CACHE_DIR=str(tmp_path / "c"))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: the spool at {path} is in format 0"), done.stderr
    assert "Traceback" not in done.stderr
    assert path.read_bytes() == before


def test_sweep_report_on_a_full_disk_delivers_directly_when_the_registry_answers(
    small_disk: SmallDisk, tiny_llama: Path, tmp_path: Path, live_registry: LiveRegistry
) -> None:
    path = small_disk.root / "spool.db"
    Spool(path)
    small_disk.fill()

    done = _sweep_report(
        tiny_llama, live_registry.url, path, tmp_path / "cache", live_registry.token("ci-node")
    )

    assert done.returncode == 0, done.stderr
    run = RunReport.model_validate_json(done.stdout)
    assert re.search(
        f"warning: {_full(path)}; run {run.run_id} was delivered to "
        f"{re.escape(live_registry.url)} directly",
        done.stderr,
    )
    with live_registry.client() as client:
        [stored] = client.get("/v1/runs").json()["data"]
    assert stored["id"] == str(run.run_id)


def test_the_daemon_keeps_an_unspoolable_run_in_memory_and_delivers_it_directly(
    small_disk: SmallDisk,
    tmp_path: Path,
    live_registry: LiveRegistry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The spool cannot take the run: it is kept in memory (and logged as JSON), and handed
    to the registry directly once one answers, so a daemon stopped before space is back has
    lost nothing the registry could take."""
    daemon = a_daemon(
        tmp_path,
        {"name": "tiny", "model": tmp_path / "tiny.gguf", "cron": "0 3 * * *"},
        registry_url=f"http://127.0.0.1:{free_port()}",  # nobody answers, at first
        token=live_registry.token("ci-node"),
        spool=small_disk.root / "spool.db",
    )
    measured, later = make_report(node="ci-node"), make_report(node="ci-node")
    runs = iter([measured, later])
    monkeypatch.setattr(
        "fleetbench.agent.daemon_config.measure_run", lambda *args, **kwargs: next(runs)
    )
    small_disk.fill()

    with caplog.at_level(logging.INFO, logger="fleetbench.daemon"):
        assert daemon._sweep(daemon.config.sweeps[0]) == "ok"
        daemon.flush()  # still full, and no registry: it waits
    assert daemon.delivery.unspooled == [measured]
    assert daemon.spool.runs() == []
    [kept] = [r for r in caplog.records if "kept in memory," in r.getMessage()]
    message = kept.getMessage()
    assert kept.levelno == logging.ERROR
    assert RunReport.model_validate_json(message[message.index("{") :]) == measured
    assert re.search(_full(daemon.spool.path), message)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("delivery")]
    assert waits and re.match(f"delivery waits: {_full(daemon.spool.path)}", waits[-1])
    assert any("stays in memory" in r.getMessage() for r in caplog.records)

    daemon.registry_url = live_registry.url  # the registry answers; the disk is still full
    with caplog.at_level(logging.INFO, logger="fleetbench.daemon"):
        daemon.flush()
    assert daemon.delivery.unspooled == []
    assert daemon.spool.runs() == []
    assert live_registry.count("runs") == 1
    assert any("delivered directly" in r.getMessage() for r in caplog.records)

    small_disk.free()
    assert daemon._sweep(daemon.config.sweeps[0]) == "ok"  # space is back: spooled again
    daemon.flush()
    [spooled] = daemon.spool.runs()
    assert (spooled.run_id, spooled.state) == (str(later.run_id), "delivered")
    assert live_registry.count("runs") == 2


def test_the_daemon_starts_on_a_full_disk_and_keeps_running(
    small_disk: SmallDisk, tmp_path: Path
) -> None:
    small_disk.fill()
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nnode = "ci-node"\nregistry_url = "http://127.0.0.1:{free_port()}"\n'
        f'spool = "{small_disk.root / "spool.db"}"\nbusy_cpu_percent = 100\n\n'
        f'[[sweep]]\nname = "missing"\nmodel = "{tmp_path / "missing.gguf"}"\n'
        'cron = "0 3 * * *"\n'
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_")}
    daemon = subprocess.Popen(
        [sys.executable, "-m", "fleetbench.agent.cli", "daemon", "--config", str(config)],
        env={**clean, "FLEETBENCH_CACHE_DIR": str(tmp_path / "cache")},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert daemon.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(daemon.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while not any("delivery waits" in line for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            assert daemon.poll() is None, "".join(lines)
            time.sleep(0.2)
        time.sleep(1)
        assert daemon.poll() is None  # still running
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        reader.join(timeout=10)
        daemon.stderr.close()
    log = "".join(lines)
    assert "Traceback" not in log
    full = _full(small_disk.root / "spool.db")
    assert re.search(f"ERROR fleetbench.daemon: {full}: runs are kept in memory until it can", log)
    [kept] = [line for line in lines if "kept in memory, the spool" in line]
    assert " ERROR fleetbench.daemon: sweep missing: run " in kept
    run = RunReport.model_validate_json(kept[kept.index("{") :])
    assert (run.status, run.node) == ("failed", "ci-node")
    assert "model file not found" in (run.error or "")
