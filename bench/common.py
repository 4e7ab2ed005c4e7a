"""What the benchmarks share: databases to fill, a registry to start, percentiles."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import psycopg
from sqlalchemy.engine import make_url

from fleetbench.agent.serving.stats import percentile as serving_percentile

__all__ = [
    "free_port",
    "libpq_url",
    "percentile",
    "recreate_database",
    "start_registry",
    "stop_registry",
]

ROOT = Path(__file__).resolve().parent.parent


def libpq_url(url: str, *, database: str | None = None) -> str:
    """The SQLAlchemy URL as a libpq connection string, optionally for another database."""
    sa_url = make_url(url).set(drivername="postgresql")
    if database is not None:
        sa_url = sa_url.set(database=database)
    return sa_url.render_as_string(hide_password=False)


def recreate_database(url: str) -> None:
    """Drops and creates the PostgreSQL database `url` names (empty, no schema)."""
    name = make_url(url).database
    if not name:
        raise SystemExit(f"{url} names no database")
    with psycopg.connect(libpq_url(url, database="postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_registry(
    database_url: str, *, workers: int = 1, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`fleetbench-registry serve` on a free loopback port, as an operator starts it; returns
    once /healthz answers."""
    port = free_port()
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": database_url, **(extra_env or {})}
    command = [sys.executable, "-m", "fleetbench.registry.cli", "serve", "--port", str(port)]
    if workers != 1:
        command += ["--workers", str(workers)]
    process = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the registry exited with status {process.returncode}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return process, base_url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop_registry(process)
    raise SystemExit("the registry did not answer /healthz within 60 s")


def stop_registry(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the registry's process group (its workers too), then SIGKILL after 20 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def percentile(values: Sequence[float], q: float) -> float:
    """The serving sweep's percentile (linear between closest ranks, numpy's default) with
    q in 0..1; NaN when empty."""
    found = serving_percentile(values, q * 100)
    return math.nan if found is None else found
