"""Rollout and capacity latency: how long `GET /v1/compare` and `GET /v1/capacity` take on
a fleet-sized registry.

What it measures
    1. Fills a PostgreSQL database (dropped and recreated) with a synthetic fleet through the
       registry's own storage layer: by default 1,000 nodes in 4 hardware classes, each
       having run 20 llama.cpp builds one after the other, `--runs` runs of each (B = 1..32
       at PP=512 TG=128, speeds with 2% noise; one class slower by 12% at B >= 8 on every
       fifth build); judges the series the fill queued, as registries' judges would have
       while the runs arrived (otherwise the measured registry's judge spends the first
       minute on a 1,000-series backlog, beside the questions); then VACUUM ANALYZE.
    2. Starts `fleetbench-registry serve` on a free loopback port.
    3. Asks each pair of successive builds once, in order: the first question about a build
       since the registry started, which reads its sums from the database (`first`).
    4. Stores one new run of the newest build on a random node (through the storage layer,
       as another registry process would) and asks that comparison again, `--fresh` times:
       the registry re-reads only the node whose sums changed (`after a run`).
    5. Asks, interleaved, a comparison of two successive builds (drawn at random) and a
       capacity question (users and per-user speed drawn at random), over HTTP with
       keep-alive, timed until the body is read. The first answers of each are checked (a
       slowed build holds naming its class; a plan's nodes serve the users asked for).
    6. Prints p50/p90/p99/max of each, and the target (p99 <= 100 ms) as PASS/MISS for the
       questions of step 5: what dashboards, CI gates and watched rollouts ask all day.

How to run (PostgreSQL on 127.0.0.1:5432, user postgres, trust auth)
    .venv/bin/python bench/compare_capacity.py               # fill (minutes), then measure
    .venv/bin/python bench/compare_capacity.py --reuse       # keep an already-filled db
    .venv/bin/python bench/compare_capacity.py --nodes 50 --builds 4 --questions 20  # quick
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    libpq_url,
    percentile,
    recreate_database,
    start_registry,
    stop_registry,
    write_result,
)
from fleetbench.contract import wire
from fleetbench.registry import crud, tokens
from fleetbench.registry.db import (
    create_db_engine,
    session_factory,
    upgrade_schema,
    write_transaction,
)
from fleetbench.registry.ingest import ingest_batch
from fleetbench.registry.regressions.judge import judge_due

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/fleetbench_bench_compare"
MODEL = "Llama-3.1-8B-Instruct-Q4_K_M"
CLASSES = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA L4")
SPEED = {CLASSES[0]: 3.0, CLASSES[1]: 2.0, CLASSES[2]: 1.5, CLASSES[3]: 0.8}
BATCHES = (1, 2, 4, 8, 16, 32)
FIRST_BUILD = 5000
TARGET_MS = 100.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--database-url", default=DEFAULT_URL, help="SQLAlchemy URL")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--builds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2, help="runs of each build per node")
    parser.add_argument("--questions", type=int, default=200, help="of each kind, measured")
    parser.add_argument("--fresh", type=int, default=20, help="comparisons after a new run")
    parser.add_argument("--reuse", action="store_true", help="keep an already-filled db")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def slowed(build: int, hardware: str, b: int) -> float:
    """Every fifth build is 12% slower on the first class at B >= 8."""
    return 0.88 if (build - FIRST_BUILD) % 5 == 4 and hardware == CLASSES[0] and b >= 8 else 1.0


def report(node: str, hardware: str, build: int, when: datetime, rng: random.Random) -> Any:
    speed = SPEED[hardware]
    points = []
    for b in BATCHES:
        factor = slowed(build, hardware, b) * speed
        s_tg = 30 * b**0.8 * factor * (1 + rng.gauss(0, 0.02))
        s_pp = 900 * factor * (1 + rng.gauss(0, 0.02))
        points.append(wire.Point(pp=512, tg=128, b=b, n_kv=b * 640, s_pp=s_pp, s_tg=s_tg))
    fingerprint = wire.HardwareFingerprint(
        hash=uuid.uuid5(uuid.NAMESPACE_DNS, node).hex * 2,
        data={"probes": {"nvidia": {"driver_version": "550.54.15", "gpus": [{"name": hardware}]}}},
    )
    return wire.RunReport(
        schema_version=wire.SCHEMA_VERSION,
        run_id=uuid.uuid4(),
        node=node,
        started_at=when,
        engine=wire.EngineBuild(build_number=build, backend="CUDA"),
        model=wire.ModelInfo(name=MODEL),
        hardware=fingerprint,
        points=points,
    )


def fill(url: str, args: argparse.Namespace) -> None:
    recreate_database(url)
    engine = create_db_engine(url)
    upgrade_schema(engine)
    rng = random.Random(args.seed)
    start = datetime.now(UTC) - timedelta(hours=args.builds * args.runs + 1)
    total = args.nodes * args.builds * args.runs
    began = time.monotonic()
    done = 0
    sessions = session_factory(engine)
    for first in range(0, args.nodes, 50):
        batch = []
        with sessions() as session, write_transaction(session):
            for n in range(first, min(first + 50, args.nodes)):
                name = f"gpu-{n:04d}"
                tokens.create_node_token(session, node_name=name, labels={})
                node = crud.find_node(session, name)
                assert node is not None
                hardware = CLASSES[n % len(CLASSES)]
                hour = 0
                for build in range(FIRST_BUILD, FIRST_BUILD + args.builds):
                    for _ in range(args.runs):
                        when = start + timedelta(hours=hour)
                        batch.append((report(name, hardware, build, when, rng), node.id))
                        hour += 1
            for stored in ingest_batch(session, batch):
                assert not isinstance(stored, Exception), stored
            session.commit()
        done += len(batch)
        rate = done / (time.monotonic() - began)
        print(f"\r  filled {done:,} of {total:,} runs ({rate:.0f}/s)", end="", flush=True)
    print()
    began = time.monotonic()
    judged = judge_due(sessions)
    took = time.monotonic() - began
    print(f"  judged the {judged.checks:,} series checks the fill queued in {took:.0f} s")
    engine.dispose()
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")


def store_one_run(url: str, nodes: int, build: int, rng: random.Random) -> None:
    """One more run of `build` on a random node, stored as a report would be."""
    engine = create_db_engine(url)
    try:
        n = rng.randrange(nodes)
        name = f"gpu-{n:04d}"
        with session_factory(engine)() as session, write_transaction(session):
            node = crud.find_node(session, name)
            assert node is not None
            run = report(name, CLASSES[n % len(CLASSES)], build, datetime.now(UTC), rng)
            [stored] = ingest_batch(session, [(run, node.id)])
            assert not isinstance(stored, Exception), stored
            session.commit()
    finally:
        engine.dispose()


def timed(client: httpx.Client, path: str, params: dict[str, Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    response = client.get(path, params=params)
    elapsed = (time.perf_counter() - began) * 1000
    if response.status_code != 200:
        raise SystemExit(f"{path} answered {response.status_code}: {response.text[:500]}")
    return elapsed, response.json()


def main() -> int:
    args = parse_args()
    if not args.reuse:
        print(f"filling {args.nodes} nodes x {args.builds} builds x {args.runs} runs ...")
        fill(args.database_url, args)
    process, base = start_registry(args.database_url)
    rng = random.Random(args.seed)
    times: dict[str, list[float]] = {"compare": [], "capacity": []}
    first: list[float] = []
    fresh: list[float] = []
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            for build in range(FIRST_BUILD, FIRST_BUILD + args.builds - 1):
                asked = {"model": MODEL, "from_build": str(build), "to_build": str(build + 1)}
                first.append(timed(client, "/v1/compare", asked)[0])
            newest = FIRST_BUILD + args.builds - 1
            asked = {"model": MODEL, "from_build": str(newest - 1), "to_build": str(newest)}
            for _ in range(args.fresh):
                store_one_run(args.database_url, args.nodes, newest, rng)
                fresh.append(timed(client, "/v1/compare", asked)[0])
            for i in range(args.questions + 5):
                build = rng.randrange(FIRST_BUILD, FIRST_BUILD + args.builds - 1)
                asked = {"model": MODEL, "from_build": str(build), "to_build": str(build + 1)}
                compare_ms, compared = timed(client, "/v1/compare", asked)
                users = rng.randrange(10, args.nodes * 8)
                need = {"model": MODEL, "users": users, "min_tps_per_user": rng.uniform(5, 40)}
                capacity_ms, planned = timed(client, "/v1/capacity", need)
                if i < 5:  # warm-up answers, checked
                    expected = "hold" if slowed(build + 1, CLASSES[0], 8) < 1 else None
                    if expected and compared["verdict"] != expected:
                        raise SystemExit(f"b{build + 1} slowed but {compared['verdict']}")
                    if planned["enough"] and planned["users_served"] < users:
                        raise SystemExit("a plan serves fewer users than asked for")
                    continue
                times["compare"].append(compare_ms)
                times["capacity"].append(capacity_ms)
    finally:
        stop_registry(process)
    print(f"{args.nodes} nodes x {args.builds} builds x {args.runs} runs, PostgreSQL, HTTP:")
    figures: dict[str, object] = {
        "fleet": {"nodes": args.nodes, "builds": args.builds, "runs_per_build": args.runs},
        "reused": args.reuse,
    }
    for name, found in (("first", first), ("after a run", fresh)):
        print(
            f"  compare, {name:11} p50 {statistics.median(found):6.1f} ms  max "
            f"{max(found):6.1f}  ({len(found)} questions)"
        )
        figures[f"compare, {name}"] = {
            "questions": len(found),
            "p50_ms": statistics.median(found),
            "max_ms": max(found),
        }
    for name, found in times.items():
        p99 = percentile(found, 0.99)
        print(
            f"  {name:9} p50 {statistics.median(found):6.1f} ms  p90 "
            f"{percentile(found, 0.9):6.1f}  p99 {p99:6.1f}  max {max(found):6.1f}  "
            f"{'PASS' if p99 <= TARGET_MS else 'MISS'} (p99 <= {TARGET_MS:g} ms)"
        )
        figures[name] = {
            "questions": len(found),
            "p50_ms": statistics.median(found),
            "p90_ms": percentile(found, 0.9),
            "p99_ms": p99,
            "max_ms": max(found),
            "target_p99_ms": TARGET_MS,
            "met": p99 <= TARGET_MS,
        }
    write_result("compare_capacity", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
