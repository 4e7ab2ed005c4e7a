"""Load: a fleet's agents reporting at once while dashboards read, against a real registry.

What it does
    1. Creates a fresh database (a SQLite file in a temporary folder, or the PostgreSQL
       database `--database-url` names, dropped and recreated), migrates it, and makes one
       node and token per writer.
    2. Starts `fleetbench-registry serve [--workers N]` on a loopback port, as an operator
       would, and seeds one run per node (not counted).
    3. For `--seconds`, `--writers` tasks each act as one node posting distinct reports of 6
       points (B = 1..32) back to back, the way agents flush a spool after an outage: a 503 or
       429 is honoured by waiting its Retry-After (plus up to a second of jitter), as the
       agent's spool does. `--readers` tasks each ask, in turn, placement (a random per-user
       speed), the node list and one node's curves, waiting `--read-interval` seconds between
       requests (a dashboard user or a scraper). Everything runs on one asyncio loop with
       httpx; nothing is sent after the deadline, and requests still in flight then are
       given the client timeout to finish.
    4. Stops the registry and checks the database: the runs stored (seeds aside) must be
       exactly the runs answered 201 or 200.

It prints accepted reports/s, write and read latency p50/p99 (every answer, whatever its
status), answers by status, the CPU seconds used by the registry, PostgreSQL and this
generator, and PASS/MISS for the targets: no jam (no 5xx but the registry's 503 with a
Retry-After, answered within a second, and no timeout), reports/s at or above
`--target-rate` (with `--write-rate`: an offered rate at or above it, 97% of it taken),
read p99 <= 100 ms. Exit status 1 when the database does not hold exactly
the runs answered 2xx.

    .venv/bin/python bench/load.py --database sqlite
    .venv/bin/python bench/load.py --database postgresql --workers 2
    .venv/bin/python bench/load.py --database postgresql --workers 2 --write-rate 200
    .venv/bin/python bench/load.py --database postgresql --writers 16 --readers 16 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, recreate_database, start_registry, stop_registry

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/fleetbench_load"
MODEL = "Meta-Llama-3.1-8B-Instruct-Q4_K_M"
CONCURRENCIES = (1, 2, 4, 8, 16, 32)
CLIENT_TIMEOUT_S = 30.0
KEPT_PACE = 0.97  # share of an offered rate that counts as taken
READ_TARGET_P99_MS = 100.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Writers and readers against a real registry on loopback.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--database-url", default=DEFAULT_PG, help="for --database postgresql")
    parser.add_argument("--workers", type=int, default=1, help="registry worker processes")
    parser.add_argument("--writers", type=int, default=200)
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--read-interval", type=float, default=1.0, help="s between reads")
    parser.add_argument(
        "--write-rate",
        type=float,
        help="reports/s offered in all, each writer at its own steady pace (default: as fast "
        "as the registry takes them)",
    )
    parser.add_argument("--target-rate", type=float, help="reports/s to meet (default by db)")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


# --- the fleet ---------------------------------------------------------------------------


def hardware(node: int) -> dict[str, Any]:
    """A fingerprint like the agent's: host and one NVIDIA GPU."""
    return {
        "hash": f"{node:064x}",
        "data": {
            "probes": {
                "host": {
                    "cpu_model": "AMD EPYC 7763 64-Core Processor",
                    "cpu_sockets": 1,
                    "cpu_cores": 64,
                    "cpu_threads": 128,
                    "memory_bytes": 512 * 2**30,
                    "os": "Linux",
                    "os_release": "Ubuntu 24.04.1 LTS",
                    "kernel": "6.8.0-45-generic",
                    "arch": "x86_64",
                },
                "nvidia": {
                    "driver_version": "550.54.15",
                    "cuda_version": "12.4",
                    "gpus": [
                        {
                            "name": "NVIDIA H100 80GB HBM3",
                            "uuid": f"GPU-{uuid.UUID(int=node)}",
                            "memory_bytes": 80 * 2**30,
                            "compute_capability": "9.0",
                            "power_limit_w": 700.0,
                        }
                    ],
                },
            },
            "notes": {},
            "complete": True,
        },
    }


def report(node: int, sequence: int, rng: random.Random) -> dict[str, Any]:
    """A distinct 6-point run of `node`: a fresh id, a later start, its own speeds."""
    started = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=sequence)
    single = 90.0 * (0.8 + 0.4 * (node % 17) / 16) * rng.gauss(1.0, 0.02)
    points = []
    for b in CONCURRENCIES:
        s_tg = single * b**0.7
        points.append(
            {
                "pp": 512,
                "tg": 128,
                "b": b,
                "n_kv": b * 640,
                "t_pp": 512 * b / (3000.0 * b**0.1),
                "s_pp": 3000.0 * b**0.1,
                "t_tg": 128 * b / s_tg,
                "s_tg": s_tg,
            }
        )
    return {
        "schema_version": 1,
        "run_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "node": node_name(node),
        "started_at": started.isoformat(),
        "finished_at": (started + timedelta(seconds=40)).isoformat(),
        "status": "ok",
        "source": "sweep",
        "engine": {"engine": "llama.cpp", "build_number": 7100, "backend": "CUDA"},
        "model": {
            "name": MODEL,
            "file_size": 4_920_734_016,
            "n_layer": 32,
            "n_head_kv": 8,
            "head_dim_k": 128,
            "head_dim_v": 128,
        },
        "settings": {"n_ctx": 20480, "n_batch": 2048, "n_ubatch": 512, "flash_attn": "auto"},
        "hardware": hardware(node),
        "points": points,
    }


def node_name(node: int) -> str:
    return f"load-node-{node:04d}"


def prepare_database(args: argparse.Namespace, work: Path) -> str:
    from fleetbench.registry.db import create_db_engine, session_factory, upgrade_schema
    from fleetbench.registry.tokens import create_node_token

    url = f"sqlite:///{work / 'registry.db'}" if args.database == "sqlite" else args.database_url
    if args.database == "postgresql":
        recreate_database(url)
    engine = create_db_engine(url)
    upgrade_schema(engine)
    with session_factory(engine)() as session:
        secrets = [
            create_node_token(session, node_name=node_name(node), labels={})
            for node in range(args.writers)
        ]
        session.commit()
    engine.dispose()
    (work / "tokens").write_text("\n".join(secrets))
    return url


def stored_run_ids(url: str) -> set[str]:
    from sqlalchemy import text

    from fleetbench.registry.db import create_db_engine

    engine = create_db_engine(url)
    with engine.connect() as connection:
        ids = {str(row[0]) for row in connection.execute(text("SELECT id FROM runs"))}
    engine.dispose()
    return {str(uuid.UUID(i)) for i in ids}


# --- the load ----------------------------------------------------------------------------


@dataclass
class Tally:
    write_ms: list[float] = field(default_factory=list)
    read_ms: dict[str, list[float]] = field(default_factory=dict)
    shed_ms: list[float] = field(default_factory=list)  # 503s with a Retry-After
    writes: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)
    accepted: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no answer (the error says why)
    retry_after: float | None = None
    error: str | None = None

    @property
    def outcome(self) -> str:
        if self.status is None:
            return self.error or "no answer"
        return f"{self.status} shed" if self.retry_after is not None else str(self.status)


async def send(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[Answer, float]:
    began = time.perf_counter()
    try:
        async with session.request(method, url, **kwargs) as response:
            await response.read()
            retry_after = response.headers.get("Retry-After")
            answer = Answer(
                response.status,
                float(retry_after) if retry_after and response.status in (429, 503) else None,
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        answer = Answer(None, error=type(exc).__name__)
    return answer, (time.perf_counter() - began) * 1000


async def writer(
    session: aiohttp.ClientSession,
    base: str,
    node: int,
    token: str,
    deadline: float,
    tally: Tally,
    seed: int,
    interval: float | None,
) -> None:
    rng = random.Random(seed * 100_003 + node)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    sequence = 1
    body = report(node, sequence, rng)
    due = time.monotonic() + (rng.uniform(0, interval) if interval else 0.0)
    while time.monotonic() < deadline:
        if interval:  # a steady pace; late when the registry is slow, never bunched up
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            due = max(due + interval, time.monotonic())
            if time.monotonic() >= deadline:
                break
        answer, ms = await send(
            session, "POST", f"{base}/v1/runs", data=json.dumps(body), headers=headers
        )
        tally.writes[answer.outcome] += 1
        if answer.retry_after is not None:
            tally.shed_ms.append(ms)
            wait = answer.retry_after + rng.random()
            await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            continue
        tally.write_ms.append(ms)
        if answer.status in (200, 201):
            tally.accepted.add(body["run_id"])
        elif answer.status is None:
            await asyncio.sleep(1.0)  # no answer: it may be stored; the next report is new
        sequence += 1
        body = report(node, sequence, rng)


async def reader(
    session: aiohttp.ClientSession,
    base: str,
    index: int,
    nodes: int,
    interval: float,
    deadline: float,
    tally: Tally,
    seed: int,
) -> None:
    rng = random.Random(seed * 7919 + index)
    kinds = ("placement", "nodes", "curves")
    turn = index
    await asyncio.sleep(rng.uniform(0, interval))  # readers do not start in step
    while time.monotonic() < deadline:
        kind = kinds[turn % len(kinds)]
        turn += 1
        if kind == "placement":
            params = {"model": MODEL, "min_tps_per_user": str(round(rng.uniform(1, 60), 1))}
            path = "/v1/placement"
        elif kind == "nodes":
            params, path = {}, "/v1/nodes"
        else:
            params = {"node": node_name(rng.randrange(nodes)), "model": MODEL}
            path = "/v1/curves"
        answer, ms = await send(session, "GET", f"{base}{path}", params=params)
        tally.read_ms.setdefault(kind, []).append(ms)
        tally.reads[f"{kind} {answer.outcome}"] += 1
        await asyncio.sleep(interval)


def client(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S),
    )


async def seed_runs(base_url: str, tokens: list[str], seed: int) -> set[str]:
    """One run per node before the clock starts, so every read has something to read."""
    rng = random.Random(seed)
    seeded = set()
    async with client(8) as session:
        for node, token in enumerate(tokens):
            body = report(node, 0, rng)
            async with session.post(
                f"{base_url}/v1/runs", json=body, headers={"Authorization": f"Bearer {token}"}
            ) as response:
                response.raise_for_status()
            seeded.add(body["run_id"])
    return seeded


async def load(base_url: str, tokens: list[str], args: argparse.Namespace) -> Tally:
    tally = Tally()
    async with client(args.writers + args.readers + 10) as session:
        deadline = time.monotonic() + args.seconds
        interval = args.writers / args.write_rate if args.write_rate else None
        tasks = [
            writer(session, base_url, node, token, deadline, tally, args.seed, interval)
            for node, token in enumerate(tokens)
        ] + [
            reader(
                session, base_url, i, len(tokens), args.read_interval, deadline, tally, args.seed
            )
            for i in range(args.readers)
        ]
        await asyncio.gather(*tasks)
    return tally


# --- reporting ---------------------------------------------------------------------------


def cpu_by_process(processes: Sequence[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two samples, counting processes started in between from 0
    (PostgreSQL starts a backend per connection)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def registry_processes(root: int) -> list[psutil.Process]:
    parent = psutil.Process(root)
    return [parent, *parent.children(recursive=True)]


def postgres_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "") == "postgres"]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_report(
    args: argparse.Namespace, tally: Tally, elapsed: float, cpu: dict[str, float]
) -> None:
    # Over the window reports were sent in: the last readers' pauses and the replies still
    # in flight at the deadline run past it, and would lower the rate by a second or two.
    rate = len(tally.accepted) / args.seconds
    target = args.target_rate or (200.0 if args.database == "postgresql" else 100.0)
    pace = f"{args.write_rate:g} reports/s offered" if args.write_rate else "as fast as taken"
    print(
        f"\n{args.database}, {args.workers} worker(s): {args.writers} writers ({pace}), "
        f"{args.readers} readers (one read each per {args.read_interval:g} s), {elapsed:.1f} s"
    )
    print(
        f"  accepted reports/s  {rate:8.1f}   ({len(tally.accepted)} runs stored in the "
        f"{args.seconds:g} s window)"
    )
    for label, values in (("write", tally.write_ms), ("shed 503", tally.shed_ms)):
        print(
            f"  {label:<9} ms p50 {percentile(values, 0.5):8.1f}  p99 "
            f"{percentile(values, 0.99):8.1f}  max {max(values, default=0):8.1f}"
            f"  ({len(values)} requests)"
        )
    all_reads = [ms for values in tally.read_ms.values() for ms in values]
    for kind, values in [*sorted(tally.read_ms.items()), ("all reads", all_reads)]:
        print(
            f"  {kind:<9} ms p50 {percentile(values, 0.5):8.1f}  p99 "
            f"{percentile(values, 0.99):8.1f}  max {max(values, default=0):8.1f}"
            f"  ({len(values)} requests)"
        )
    print(f"  writes by answer: {dict(sorted(tally.writes.items()))}")
    print(f"  reads by answer:  {dict(sorted(tally.reads.items()))}")
    print(
        "  CPU seconds: "
        + ", ".join(
            f"{name} {seconds:.1f} ({seconds / elapsed:.2f} cores)" for name, seconds in cpu.items()
        )
    )
    failures = [
        k
        for k in [*tally.writes, *tally.reads]
        if not (k.split()[-1][:1] in "234" or k.endswith("503 shed"))
    ]
    slow_shed = percentile(tally.shed_ms, 0.99) > 1000 if tally.shed_ms else False
    print("targets")
    print(
        f"  no jam (no 5xx but quick 503s, no timeout)  "
        f"{verdict(not failures and not slow_shed)} {failures or ''}"
    )
    if args.write_rate:
        # Offered at a steady pace, the rate cannot pass what was offered, and the last
        # second's reports land after the window: held means nearly all of it was taken.
        held = rate >= KEPT_PACE * args.write_rate and args.write_rate >= target
        print(
            f"  reports/s >= {target:g} (offered {args.write_rate:g}, taken >= "
            f"{KEPT_PACE:.0%})  {rate:8.1f}  {verdict(held)}"
        )
    else:
        print(f"  reports/s >= {target:g}            {rate:8.1f}  {verdict(rate >= target)}")
    read_p99 = percentile(all_reads, 0.99)
    print(
        f"  read p99 <= {READ_TARGET_P99_MS:g} ms           {read_p99:8.1f}  "
        f"{verdict(read_p99 <= READ_TARGET_P99_MS)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="fleetbench-load-") as folder:
        work = Path(folder)
        url = prepare_database(args, work)
        tokens = (work / "tokens").read_text().split("\n")
        process, base_url = start_registry(url, workers=args.workers)
        try:
            seeded = asyncio.run(seed_runs(base_url, tokens, args.seed))
            postgres = args.database == "postgresql"
            server = cpu_by_process(registry_processes(process.pid))
            database = cpu_by_process(postgres_processes()) if postgres else {}
            mine = resource.getrusage(resource.RUSAGE_SELF)
            began = time.monotonic()
            tally = asyncio.run(load(base_url, tokens, args))
            elapsed = time.monotonic() - began
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = {
                "registry": cpu_used(server, cpu_by_process(registry_processes(process.pid))),
                "postgresql": cpu_used(database, cpu_by_process(postgres_processes()))
                if postgres
                else 0.0,
                "load generator": (after.ru_utime + after.ru_stime)
                - (mine.ru_utime + mine.ru_stime),
            }
        finally:
            stop_registry(process)
        stored = stored_run_ids(url) - seeded
    print_report(args, tally, elapsed, cpu)
    missing = tally.accepted - stored
    unexpected = stored - tally.accepted
    print(
        f"database holds exactly the runs answered 2xx: {verdict(not missing and not unexpected)}"
        f" ({len(stored)} stored, {len(missing)} answered 2xx but missing, {len(unexpected)} "
        f"stored without a 2xx answer)"
    )
    return 0 if not missing and not unexpected else 1


if __name__ == "__main__":
    sys.exit(main())
