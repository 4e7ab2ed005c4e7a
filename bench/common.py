"""What the benchmarks share: databases to fill, a registry to start, percentiles, and the
file each run leaves under bench/results/ (write_result)."""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil
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
    "write_result",
]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


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


def write_result(
    benchmark: str,
    figures: Mapping[str, object],
    *,
    arguments: Sequence[str] | None = None,
    machine: Mapping[str, object] | None = None,
    results_dir: Path | None = None,
) -> Path:
    """Writes one run's raw result, `<results_dir>/<benchmark>-<UTC date>-<short commit>.json`
    (`-2`, `-3`, ... after it when that file exists: an earlier run's file is never
    overwritten), prints its path and returns it.

    The file holds the benchmark's name, the date (UTC, to the second), the machine (CPU
    model, logical cores, memory, OS, Python; `machine` adds what the script knows besides,
    e.g. its GPUs), the commit (HEAD, and whether the working tree differed from it outside
    bench/results/), the command (`arguments` are the script's arguments, sys.argv's by
    default) and `figures`: what the script printed, JSON-serialisable (mappings, sequences,
    str, int, float, bool, None; a NaN or infinite float is written as null)."""
    now = datetime.now(UTC).replace(microsecond=0)
    commit = _commit()
    short = str(commit["sha"])[:7] if commit["sha"] else "nocommit"
    argv = sys.argv[1:] if arguments is None else list(arguments)
    result = {
        "benchmark": benchmark,
        "date": now.isoformat(),
        "machine": {**_machine(), **(machine or {})},
        "commit": commit,
        "command": [_shown(sys.argv[0]), *argv],
        "figures": _plain(figures),
    }
    text = json.dumps(result, indent=1, allow_nan=False) + "\n"
    folder = RESULTS if results_dir is None else results_dir
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{benchmark}-{now:%Y-%m-%d}-{short}"
    for n in range(1, 10_000):
        path = folder / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
        try:
            with path.open("x", encoding="utf-8") as out:
                out.write(text)
        except FileExistsError:
            continue
        print(f"result: {_shown(str(path))}")
        return path
    raise SystemExit(f"{folder} holds 9,999 results of {stem}: none written")


def _plain(value: object) -> object:
    """`value` as JSON's types: mappings with string keys, lists, str, int, float (a NaN or
    an infinity as None), bool, None; anything else is a mistake of the caller."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence):
        return [_plain(item) for item in value]
    raise TypeError(f"a result's figure must be JSON, not {type(value).__name__}: {value!r}")


def _machine() -> dict[str, object]:
    """What the figures depend on, without naming the host."""
    return {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> dict[str, object]:
    """HEAD of the repository the benchmarks are in, and whether anything but bench/results/
    differs from it (changed, staged or untracked); None and None outside a git checkout."""

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
    return {
        "sha": sha.strip() if sha else None,
        "dirty": None if sha is None or status is None else bool(status.strip()),
    }


def _shown(path: str) -> str:
    """A path under the repository as relative to it (bench/x.py), any other as given."""
    if not path:
        return path
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path
