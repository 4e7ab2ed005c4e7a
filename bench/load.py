"""Load: a fleet's agents reporting at once while dashboards read, against a real registry,
and what each report costs.

What it does
    1. Creates a fresh database (a SQLite file in a temporary folder, or the PostgreSQL
       database `--database-url` names, dropped and recreated), migrates it, and makes one
       node and token per node: `--writers` / `--writers-per-node` nodes.
    2. Starts `fleetbench-registry serve [--workers N]` on a loopback port, as an operator
       would, and seeds one run per node; with `--history H`, clones each node's run H times
       into the past (what years of sweeps leave in a node's series). None of these count.
    3. For `--seconds`, `--writers` tasks post distinct reports of 6 points (B = 1..32) back
       to back, `--writers-per-node` of them for each node at once (several agents behind
       one node's token, or a node flushing its spool in parallel), the way agents flush a
       spool after an outage: a 503 or 429 is honoured by waiting its Retry-After (plus up
       to a second of jitter), as the agent's spool does. `--readers` tasks each ask, in
       turn, placement (a random per-user speed), the node list and one node's curves,
       waiting `--read-interval` seconds between requests (a dashboard user or a scraper).
       With `--slow-bodies N`, N connections meanwhile trickle request bodies (half with
       no token, half each with a node token of its own), as an attacker would: the
       writers' latency beside a run without them says what the attack costs the fleet.
       Everything runs on one asyncio loop with aiohttp; nothing is sent after the deadline.
    4. Waits until the registry has judged every series the reports queued (the regression
       check's work belongs to the reports), then samples CPU again, stops the registry and
       checks the database: the runs received during the load must be exactly the runs
       answered 201 or 200.

It prints accepted reports/s; write, shed and read latency p50/p99; answers by status; CPU
milliseconds per accepted report of the registry's processes, PostgreSQL's and this
generator's; the registry's own account of each ingest and judge step per report (CPU,
statements, rows: its /metrics); PostgreSQL's costliest statements per report where it loads
pg_stat_statements; and PASS/MISS for the targets: no jam (no 5xx but 503s with a
Retry-After, no timeout), sheds answered within 100 ms, reports/s at or above
`--target-rate` (with `--write-rate`: an offered rate at or above it, 97% of it taken), read
p99 <= 100 ms, and <= 3 ms of registry CPU and of PostgreSQL CPU per report. Exit status 1
when the database does not hold exactly the runs answered 2xx.

    .venv/bin/python bench/load.py --database sqlite
    .venv/bin/python bench/load.py --database postgresql --workers 2
    .venv/bin/python bench/load.py --database postgresql --workers 2 --write-rate 200
    .venv/bin/python bench/load.py --database postgresql --workers 2 --slow-bodies 70
    .venv/bin/python bench/load.py --database postgresql --workers 2 --writers-per-node 10
    .venv/bin/python bench/load.py --database postgresql --workers 2 --writers-per-node 10 \\
        --history 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, start_registry, stop_registry, write_result
from bench.load_costs import StatementCosts, print_costs, sample_costs, step_costs
from bench.load_fleet import (
    MODEL,
    node_name,
    prepare_database,
    queued_checks,
    report,
    seed_history,
    stored_run_ids,
)
from fleetbench.registry.db import create_db_engine

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/fleetbench_load"
CLIENT_TIMEOUT_S = 30.0
KEPT_PACE = 0.97  # share of an offered rate that counts as taken
READ_TARGET_P99_MS = 100.0
SHED_TARGET_P99_MS = 100.0
CPU_TARGET_MS = 3.0  # per report, the registry's and PostgreSQL's each
JUDGED_WITHIN_S = 120.0  # after the load, beyond the registry's check delay


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Writers and readers against a real registry on loopback.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--database-url", default=DEFAULT_PG, help="for --database postgresql")
    parser.add_argument("--workers", type=int, default=1, help="registry worker processes")
    parser.add_argument("--writers", type=int, default=200)
    parser.add_argument(
        "--writers-per-node", type=int, default=1, help="writers posting for each node at once"
    )
    parser.add_argument("--history", type=int, default=0, help="runs already in each node's series")
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--read-interval", type=float, default=1.0, help="s between reads")
    parser.add_argument(
        "--write-rate",
        type=float,
        help="reports/s offered in all, each writer at its own steady pace (default: as fast "
        "as the registry takes them)",
    )
    parser.add_argument(
        "--slow-bodies",
        type=int,
        default=0,
        help="connections meanwhile sending a body one byte every 2 s, half without a token "
        "(PUT /v1/plans/x), half each with a node token of its own (POST /v1/runs), "
        "reconnecting once answered: what anyone reaching the port can do",
    )
    parser.add_argument("--target-rate", type=float, help="reports/s to meet (default by db)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.writers_per_node < 1 or args.writers % args.writers_per_node:
        parser.error("--writers must be a multiple of --writers-per-node")
    return args


# --- the load ----------------------------------------------------------------------------


@dataclass
class Tally:
    write_ms: list[float] = field(default_factory=list)
    read_ms: dict[str, list[float]] = field(default_factory=dict)
    shed_ms: list[float] = field(default_factory=list)  # 503s and 429s with a Retry-After
    writes: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)
    accepted: set[str] = field(default_factory=set)
    slow: Counter[str] = field(default_factory=Counter)  # the slow bodies' answers


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


@dataclass(frozen=True)
class Writer:
    """One of a node's `of` writers (`index` among them)."""

    node: int
    token: str
    index: int
    of: int

    def report(self, sequence: int, rng: random.Random) -> dict[str, Any]:
        # the node's writers take turns on the minutes, so each run starts at its own time
        return report(self.node, sequence * self.of + self.index, rng)


async def write(
    session: aiohttp.ClientSession,
    base: str,
    me: Writer,
    deadline: float,
    tally: Tally,
    seed: int,
    interval: float | None,
) -> None:
    rng = random.Random((seed * 100_003 + me.node) * 101 + me.index)
    headers = {"Authorization": f"Bearer {me.token}", "Content-Type": "application/json"}
    sequence = 1
    body = me.report(sequence, rng)
    due = time.monotonic() + (rng.uniform(0, interval) if interval else 0.0)
    while time.monotonic() < deadline:
        if interval:  # a steady pace; late when the registry is slow, never bunched up
            await asyncio.sleep(max(0.0, min(due, deadline) - time.monotonic()))
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
        body = me.report(sequence, rng)


async def read(
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


async def seed_runs(base_url: str, tokens: list[str], seed: int) -> None:
    """One run per node before the clock starts, so every read has something to read."""
    rng = random.Random(seed)
    async with client(8) as session:
        for node, token in enumerate(tokens):
            async with session.post(
                f"{base_url}/v1/runs",
                json=report(node, 0, rng),
                headers={"Authorization": f"Bearer {token}"},
            ) as response:
                response.raise_for_status()


SLOW_BYTE_EVERY_S = 2.0


async def slow_body(base_url: str, token: str | None, deadline: float, tally: Tally) -> None:
    """Sends a request's head and then its body a byte every 2 s, until answered (then
    again, on a new connection) or the deadline."""
    address = base_url.removeprefix("http://")
    host, port = address.rsplit(":", 1)
    method, path = ("POST", "/v1/runs") if token else ("PUT", "/v1/plans/x")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: 100000\r\n\r\n"
    ).encode()
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(head)
            answer = b""
            while time.monotonic() < deadline and not answer:
                try:
                    answer = await asyncio.wait_for(reader.read(200), SLOW_BYTE_EVERY_S)
                except TimeoutError:
                    writer.write(b" ")
                    await writer.drain()
            if answer:
                tally.slow[answer.split(b" ", 2)[1].decode()] += 1
            await asyncio.sleep(SLOW_BYTE_EVERY_S)  # as slow to come back
        except OSError as exc:
            tally.slow[type(exc).__name__] += 1
        finally:
            writer.close()


async def load(
    base_url: str, tokens: list[str], slow_tokens: list[str], args: argparse.Namespace
) -> Tally:
    tally = Tally()
    writers = [
        Writer(node, token, index, args.writers_per_node)
        for node, token in enumerate(tokens)
        for index in range(args.writers_per_node)
    ]
    async with client(args.writers + args.readers + 10) as session:
        deadline = time.monotonic() + args.seconds
        interval = args.writers / args.write_rate if args.write_rate else None
        tasks = [
            write(session, base_url, me, deadline, tally, args.seed, interval) for me in writers
        ] + [
            read(session, base_url, i, len(tokens), args.read_interval, deadline, tally, args.seed)
            for i in range(args.readers)
        ]
        tasks += [
            slow_body(base_url, token, deadline, tally)
            for token in [None] * (args.slow_bodies - len(slow_tokens)) + slow_tokens
        ]
        await asyncio.gather(*tasks)
    return tally


def wait_judged(url: str) -> float:
    """Seconds until the registry's judges have finished every series check queued."""
    engine = create_db_engine(url)
    began = time.monotonic()
    try:
        while queued_checks(engine):
            if time.monotonic() - began > JUDGED_WITHIN_S:
                raise SystemExit(f"series checks still queued after {JUDGED_WITHIN_S:g} s")
            time.sleep(0.2)
    finally:
        engine.dispose()
    return time.monotonic() - began


# --- reporting ---------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_load(args: argparse.Namespace, tally: Tally, elapsed: float) -> dict[str, object]:
    """Prints the load's figures; returns them for the run's result file."""
    # Over the window reports were sent in: the last readers' pauses and the replies still
    # in flight at the deadline run past it, and would lower the rate by a second or two.
    rate = len(tally.accepted) / args.seconds
    pace = f"{args.write_rate:g} reports/s offered" if args.write_rate else "as fast as taken"
    nodes = args.writers // args.writers_per_node
    print(
        f"\n{args.database}, {args.workers} worker(s): {args.writers} writers ({pace}) for "
        f"{nodes} nodes ({args.writers_per_node} each), {args.history} runs of history per "
        f"node, {args.readers} readers (one read each per {args.read_interval:g} s), "
        f"{elapsed:.1f} s"
    )
    print(
        f"  accepted reports/s  {rate:8.1f}   ({len(tally.accepted)} runs stored in the "
        f"{args.seconds:g} s window)"
    )
    all_reads = [ms for values in tally.read_ms.values() for ms in values]
    latency: dict[str, dict[str, float]] = {}
    for label, values in [
        ("write", tally.write_ms),
        ("shed 503", tally.shed_ms),
        *sorted(tally.read_ms.items()),
        ("all reads", all_reads),
    ]:
        print(
            f"  {label:<9} ms p50 {percentile(values, 0.5):8.1f}  p99 "
            f"{percentile(values, 0.99):8.1f}  max {max(values, default=0):8.1f}"
            f"  ({len(values)} requests)"
        )
        latency[label] = {
            "p50_ms": percentile(values, 0.5),
            "p99_ms": percentile(values, 0.99),
            "max_ms": max(values, default=0),
            "requests": len(values),
        }
    print(f"  writes by answer: {dict(sorted(tally.writes.items()))}")
    print(f"  reads by answer:  {dict(sorted(tally.reads.items()))}")
    if args.slow_bodies:
        print(
            f"  {args.slow_bodies} slow bodies meanwhile, answered: "
            f"{dict(sorted(tally.slow.items()))}"
        )
    return {
        "nodes": nodes,
        "seconds": round(elapsed, 1),
        "accepted_reports_per_s": rate,
        "accepted": len(tally.accepted),
        "latency": latency,
        "writes_by_answer": dict(sorted(tally.writes.items())),
        "reads_by_answer": dict(sorted(tally.reads.items())),
        "slow_bodies_answered": dict(sorted(tally.slow.items())),
    }


def print_targets(
    args: argparse.Namespace, tally: Tally, cpu_ms: dict[str, float]
) -> dict[str, dict[str, object]]:
    """Prints the targets, PASS or MISS; returns them for the run's result file."""
    rate = len(tally.accepted) / args.seconds
    target = args.target_rate or (200.0 if args.database == "postgresql" else 100.0)
    failures = [
        k
        for k in [*tally.writes, *tally.reads]
        if not (k.split()[-1][:1] in "234" or k.endswith("503 shed"))
    ]
    shed_p99 = percentile(tally.shed_ms, 0.99) if tally.shed_ms else 0.0
    read_p99 = percentile([ms for v in tally.read_ms.values() for ms in v], 0.99)
    print("targets")
    print(f"  no jam (no 5xx but 503s, no timeout)   {verdict(not failures)} {failures or ''}")
    print(
        f"  sheds answered within {SHED_TARGET_P99_MS:g} ms (p99)  {shed_p99:8.1f}  "
        f"{verdict(shed_p99 <= SHED_TARGET_P99_MS)}"
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
        held = rate >= target
        print(
            f"  reports/s >= {target:g}                    {rate:8.1f}  {verdict(rate >= target)}"
        )
    print(
        f"  read p99 <= {READ_TARGET_P99_MS:g} ms                   {read_p99:8.1f}  "
        f"{verdict(read_p99 <= READ_TARGET_P99_MS)}"
    )
    targets: dict[str, dict[str, object]] = {
        "no jam": {"failures": failures, "met": not failures},
        "shed p99 ms": {
            "target": SHED_TARGET_P99_MS,
            "value": shed_p99,
            "met": shed_p99 <= SHED_TARGET_P99_MS,
        },
        "reports/s": {"target": target, "offered": args.write_rate, "value": rate, "met": held},
        "read p99 ms": {
            "target": READ_TARGET_P99_MS,
            "value": read_p99,
            "met": read_p99 <= READ_TARGET_P99_MS,
        },
    }
    for name in ("registry", "postgresql") if args.database == "postgresql" else ("registry",):
        print(
            f"  {name} CPU <= {CPU_TARGET_MS:g} ms per report     {cpu_ms[name]:8.3f}  "
            f"{verdict(cpu_ms[name] <= CPU_TARGET_MS)}"
        )
        targets[f"{name} CPU ms per report"] = {
            "target": CPU_TARGET_MS,
            "value": cpu_ms[name],
            "met": cpu_ms[name] <= CPU_TARGET_MS,
        }
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    postgres = args.database == "postgresql"
    with tempfile.TemporaryDirectory(prefix="fleetbench-load-") as folder:
        nodes = args.writers // args.writers_per_node
        slow_nodes = args.slow_bodies // 2
        url, tokens = prepare_database(
            args.database, args.database_url, Path(folder), nodes + slow_nodes
        )
        tokens, slow_tokens = tokens[:nodes], tokens[nodes:]
        process, base_url = start_registry(url, workers=args.workers)
        try:
            asyncio.run(seed_runs(base_url, tokens, args.seed))
            if args.history:
                seed_history(url, args.history)
            wait_judged(url)
            statements = StatementCosts(url) if postgres else None
            began_at = datetime.now(UTC)
            before = sample_costs(process.pid, base_url, postgres=postgres)
            began = time.monotonic()
            tally = asyncio.run(load(base_url, tokens, slow_tokens, args))
            elapsed = time.monotonic() - began
            judging = wait_judged(url)
            after = sample_costs(process.pid, base_url, postgres=postgres)
            sampled = time.monotonic() - began
        finally:
            stop_registry(process)
        stored = stored_run_ids(url, received_since=began_at)
    figures = print_load(args, tally, elapsed)
    print(f"  the judges finished the series checks {judging:.1f} s after the load")
    cpu_ms = print_costs(
        before, after, reports=len(tally.accepted), seconds=sampled, statements=statements
    )
    targets = print_targets(args, tally, cpu_ms)
    missing = tally.accepted - stored
    unexpected = stored - tally.accepted
    print(
        f"database holds exactly the runs answered 2xx: {verdict(not missing and not unexpected)}"
        f" ({len(stored)} stored, {len(missing)} answered 2xx but missing, {len(unexpected)} "
        f"stored without a 2xx answer)"
    )
    figures |= {
        "judged_after_load_s": round(judging, 1),
        "cpu_ms_per_report": cpu_ms,
        "steps_per_report": step_costs(before, after, reports=len(tally.accepted)),
        "targets": targets,
        "database_exact": {
            "stored": len(stored),
            "missing": len(missing),
            "unexpected": len(unexpected),
            "met": not missing and not unexpected,
        },
    }
    write_result("load", figures, arguments=argv)
    return 0 if not missing and not unexpected else 1


if __name__ == "__main__":
    sys.exit(main())
