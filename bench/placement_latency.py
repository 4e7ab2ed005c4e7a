"""Placement latency: how long `GET /v1/placement` takes on a fleet-sized registry, next to
the same question answered by one hand-written SQL query over the same table (each node's
latest curve), and by the hand-written query over the runs that the registry used before.

What it measures
    1. Fills a PostgreSQL database (dropped and recreated) with a synthetic fleet: by default
       1,000 nodes x 10 models x 30 runs per node and model x 6 concurrencies (B = 1..32) at
       PP=512 TG=128, i.e. 300,000 runs and ~1.76M points (`--runs 300`: 17.6M), loaded with
       binary COPY into the schema (secondary indexes and foreign keys of runs and
       run_points rebuilt afterwards from their catalog definitions); then the tables
       derived from the runs (each node's latest curves, with their knees) are rebuilt from
       them, as `fleetbench-registry rebuild` does after a backup of the runs is restored;
       then VACUUM ANALYZE. About 2% of runs failed (no points).
    2. Starts `fleetbench-registry serve` on a free loopback port.
    3. Asks each question, `model` and `min_tps_per_user` drawn at random, three ways: over
       HTTP (httpx, keep-alive; timed until the body is read), and as each hand-written
       query straight through psycopg (timed until every row is fetched); which goes first
       rotates from one question to the next, so noise and cache warmth hit all alike.
       Warm-up questions and every `--verify-every`-th are checked: the API's candidates
       (node, concurrency, run) must equal both queries' answers, in order; a mismatch
       aborts the run.
    4. Prints p50/p90/p99/max of the three, the API/SQL ratios, and the targets (API p99 <=
       25 ms, or 50 ms at 100 runs per node and model and more; API/SQL <= 1.5) as PASS/MISS.
       The exit status is 0 either way; 1 on a wrong answer.

How to run (PostgreSQL on 127.0.0.1:5432, user postgres, trust auth)
    .venv/bin/python bench/placement_latency.py                  # fill, then measure
    .venv/bin/python bench/placement_latency.py --reuse          # keep an already-filled db
    .venv/bin/python bench/placement_latency.py --runs 300 --database-url ...fleetbench_bench_10x
    .venv/bin/python bench/placement_latency.py --reuse --limit 1000   # full lists
    .venv/bin/python bench/placement_latency.py --nodes 50 --runs 5 --pairs 50   # quick look

The benchmark database is left in place so that `--reuse` can skip the fill next time.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    libpq_url,
    percentile,
    recreate_database,
    start_registry,
    stop_registry,
    write_result,
)
from fleetbench.registry.ingest import build_identity
from fleetbench.registry.ingest.statements import MODEL_FACTS

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/fleetbench_bench"
CONCURRENCIES = (1, 2, 4, 8, 16, 32)
PP = 512
TG = 128
HISTORY = timedelta(days=90)
RELEASES = 12  # llama.cpp releases over the history, one engine_builds row per backend each
TARGET_RATIO = 1.5

# The question as one hand-written PostgreSQL query over the table of each node's latest
# curve (what the registry answers from), the way someone who knows the indexes writes it:
# for each node's latest run of the model, of its points the largest B with S_TG >= X*B
# (tie: larger S_TG); the first `limit` by S_TG descending and how many qualify. (The bench's
# fleet has one model row per name; the registry also merges rows of one name, and finds the
# best on offer when no node qualifies, in the same pass.)
LATEST_SQL = """
SELECT n.name, best.b, best.s_tg / best.b, best.s_tg, best.s_pp, best.pp, best.tg,
       e.build_number, h.started_at, h.run_id, count(*) OVER () AS qualifying
FROM models m
JOIN latest_runs h ON h.model_id = m.id
JOIN nodes n ON n.id = h.node_id
CROSS JOIN LATERAL (
    SELECT p.b, p.s_tg, p.s_pp, p.pp, p.tg FROM latest_points p
    WHERE p.node_id = h.node_id AND p.model_id = h.model_id AND p.s_tg >= %(min_tps)s * p.b
    ORDER BY p.b DESC, p.s_tg DESC LIMIT 1
) best
JOIN engine_builds e ON e.id = h.build_id
WHERE m.name_key = %(name_key)s
ORDER BY best.s_tg DESC, n.name
LIMIT %(limit)s
"""
# The same over the runs themselves, as before the latest tables: for each node its latest
# non-failed run of the model (one probe of ix_runs_node_model_started per node), then that
# run's points.
PLACEMENT_SQL = """
SELECT n.name, best.b, best.s_tg / best.b, best.s_tg, best.s_pp, best.pp, best.tg,
       e.build_number, latest.started_at, latest.id, count(*) OVER () AS qualifying
FROM models m
CROSS JOIN nodes n
CROSS JOIN LATERAL (
    SELECT r.id, r.started_at, r.build_id FROM runs r
    WHERE r.node_id = n.id AND r.model_id = m.id AND r.status <> 'failed'
    ORDER BY r.started_at DESC, r.received_at DESC LIMIT 1
) latest
CROSS JOIN LATERAL (
    SELECT p.b, p.s_tg, p.s_pp, p.pp, p.tg FROM run_points p
    WHERE p.run_id = latest.id AND p.s_tg >= %(min_tps)s * p.b
    ORDER BY p.b DESC, p.s_tg DESC LIMIT 1
) best
JOIN engine_builds e ON e.id = latest.build_id
WHERE m.name_key = %(name_key)s
ORDER BY best.s_tg DESC, n.name
LIMIT %(limit)s
"""


# --- configuration -----------------------------------------------------------------------


@dataclass(frozen=True)
class FleetShape:
    nodes: int
    models: int
    runs: int
    fail_rate: float
    seed: int

    @property
    def run_count(self) -> int:
        return self.nodes * self.models * self.runs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Placement latency through the API vs one SQL query.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--database-url", default=DEFAULT_URL, help="SQLAlchemy URL")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--runs", type=int, default=30, help="runs per node and model")
    parser.add_argument("--fail-rate", type=float, default=0.02, help="share of failed runs")
    parser.add_argument("--reuse", action="store_true", help="skip the fill if counts match")
    parser.add_argument("--pairs", type=int, default=300, help="measured API+SQL pairs")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured pairs (verified)")
    parser.add_argument("--verify-every", type=int, default=10, help="verify every Nth pair")
    parser.add_argument("--min-tps", type=float, default=1.0, help="lowest threshold drawn")
    parser.add_argument("--max-tps", type=float, default=100.0, help="highest threshold drawn")
    parser.add_argument("--limit", type=int, default=100, help="candidates listed per answer")
    parser.add_argument(
        "--target-p99-ms",
        type=float,
        help="API p99 to meet (default: 25 ms, or 50 ms for 100 runs per node and model or more)",
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


# --- the synthetic fleet -----------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    backend: str
    gpu: str
    bandwidth_gbs: float
    tflops: float


@dataclass(frozen=True)
class NodeProfile:
    node_id: int
    name: str
    hardware: Hardware
    speed: float  # multiplies the hardware's bandwidth and compute
    alpha: float  # S_TG grows as B**alpha: sublinear batching gain
    build_lag: int  # releases behind the newest


@dataclass(frozen=True)
class ModelSpec:
    model_id: int
    name: str
    file_gb: float
    params_b: float


HARDWARE = (
    Hardware("CUDA", "NVIDIA GeForce RTX 4090", 1008, 165),
    Hardware("CUDA", "NVIDIA GeForce RTX 3090", 936, 71),
    Hardware("CUDA", "NVIDIA L4", 300, 121),
    Hardware("CUDA", "NVIDIA A100 80GB PCIe", 1935, 312),
    Hardware("CUDA", "NVIDIA H100 PCIe", 2000, 756),
    Hardware("Metal", "Apple M2 Max", 400, 27),
    Hardware("Metal", "Apple M4 Pro", 273, 17),
    Hardware("Metal", "Apple M3 Ultra", 819, 57),
)
BACKENDS = ("CUDA", "Metal")

MODELS = (
    ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", 4.9, 8.0),
    ("Mistral-Nemo-Instruct-2407-Q4_K_M.gguf", 7.5, 12.2),
    ("Qwen2.5-7B-Instruct-Q4_K_M.gguf", 4.7, 7.6),
    ("Qwen2.5-14B-Instruct-Q4_K_M.gguf", 9.0, 14.8),
    ("Qwen2.5-32B-Instruct-Q4_K_M.gguf", 19.9, 32.8),
    ("gemma-2-9b-it-Q4_K_M.gguf", 5.8, 9.2),
    ("Phi-3.5-mini-instruct-Q4_K_M.gguf", 2.4, 3.8),
    ("Llama-3.2-3B-Instruct-Q8_0.gguf", 3.4, 3.2),
    ("Meta-Llama-3.1-70B-Instruct-Q4_K_M.gguf", 42.5, 70.6),
    ("DeepSeek-R1-Distill-Qwen-7B-Q6_K.gguf", 6.3, 7.6),
)


def model_specs(count: int) -> list[ModelSpec]:
    specs = []
    for i in range(count):
        name, file_gb, params_b = MODELS[i % len(MODELS)]
        if i >= len(MODELS):
            name = name.replace(".gguf", f"-v{i // len(MODELS)}.gguf")
        specs.append(ModelSpec(i + 1, name, file_gb, params_b))
    return specs


def node_profiles(count: int, rng: random.Random) -> list[NodeProfile]:
    return [
        NodeProfile(
            node_id=i + 1,
            name=f"node-{i + 1:04d}",
            hardware=rng.choice(HARDWARE),
            speed=rng.uniform(0.7, 1.1),
            alpha=rng.uniform(0.55, 0.9),
            build_lag=rng.choice((0, 0, 0, 1, 1, 2)),
        )
        for i in range(count)
    ]


def build_id(backend: str, release: int) -> int:
    return BACKENDS.index(backend) * RELEASES + release + 1


def engine_build_rows() -> Iterator[tuple[Any, ...]]:
    for backend in BACKENDS:
        for release in range(RELEASES):
            number = 4100 + 45 * release
            fields = {
                "engine": "llama.cpp",
                "build_number": number,
                "commit": hashlib.sha1(str(number).encode()).hexdigest()[:9],
                "backend": backend,
                "binding": None,
                "binding_version": None,
            }
            yield (build_id(backend, release), build_identity(fields), *fields.values())


def model_rows(specs: Iterable[ModelSpec]) -> Iterator[tuple[Any, ...]]:
    for spec in specs:
        digest = hashlib.sha256(spec.name.encode()).hexdigest()
        name_key = spec.name.lower().removesuffix(".gguf")
        yield spec.model_id, f"sha256:{digest}:{name_key}", spec.name, name_key, digest


def model_facts_rows(specs: Iterable[ModelSpec]) -> Iterator[tuple[Any, ...]]:
    """One set of facts per model, its id the model's, with the identity ingest gives it."""
    for spec in specs:
        facts: dict[str, Any] = dict.fromkeys(MODEL_FACTS)
        facts |= {
            "quantization": spec.name.rsplit("-", 1)[1].removesuffix(".gguf"),
            "n_params": int(spec.params_b * 1e9),
            "file_size": int(spec.file_gb * 1e9),
        }
        yield (
            spec.model_id,
            spec.model_id,
            build_identity(facts),
            facts["quantization"],
            facts["n_params"],
            facts["file_size"],
        )


def node_rows(nodes: Iterable[NodeProfile], now: datetime) -> Iterator[tuple[Any, ...]]:
    for node in nodes:
        labels = {"gpu": node.hardware.gpu, "rack": f"r{node.node_id % 40:02d}"}
        yield node.node_id, node.name, labels, now - HISTORY - timedelta(days=30)


def fingerprint_rows(nodes: Iterable[NodeProfile], now: datetime) -> Iterator[tuple[Any, ...]]:
    for node in nodes:
        data = {"gpu": node.hardware.gpu, "backend": node.hardware.backend}
        digest = hashlib.sha256(f"{node.name}/{node.hardware.gpu}".encode()).hexdigest()
        yield node.node_id, node.node_id, digest, data, now - HISTORY, now


@dataclass(frozen=True)
class PlannedRun:
    started: float  # seconds since the epoch
    node: NodeProfile
    model: ModelSpec
    run_id: uuid.UUID
    failed: bool
    noise: float


def plan_runs(
    nodes: Sequence[NodeProfile], models: Sequence[ModelSpec], shape: FleetShape, now: datetime
) -> list[PlannedRun]:
    """Every run of the fleet, in the order they were reported (by start time)."""
    rng = random.Random(shape.seed + 1)
    end = now.timestamp() - 600
    start = end - HISTORY.total_seconds()
    runs = [
        PlannedRun(
            started=rng.uniform(start, end),
            node=node,
            model=model,
            run_id=uuid.UUID(int=rng.getrandbits(128), version=4),
            failed=rng.random() < shape.fail_rate,
            noise=rng.gauss(1.0, 0.03),
        )
        for node in nodes
        for model in models
        for _ in range(shape.runs)
    ]
    runs.sort(key=lambda run: run.started)
    return runs


def run_rows(runs: Iterable[PlannedRun], rng: random.Random) -> Iterator[tuple[Any, ...]]:
    first = min((run.started for run in runs), default=0.0)
    release_every = HISTORY.total_seconds() / RELEASES
    for run in runs:
        started = datetime.fromtimestamp(run.started, UTC)
        finished = started + timedelta(seconds=rng.uniform(60, 600))
        newest = min(RELEASES - 1, int((run.started - first) / release_every))
        release = max(0, newest - run.node.build_lag)
        yield (
            run.run_id,
            run.run_id,  # as reported
            run.node.node_id,
            run.node.node_id,  # fingerprint id
            build_id(run.node.hardware.backend, release),
            run.model.model_id,
            run.model.model_id,  # its facts' id
            "sweep",
            "failed" if run.failed else "ok",
            "llama-batched-bench exited with status 1" if run.failed else None,
            started,
            finished,
            finished + timedelta(seconds=rng.uniform(0.5, 5)),
            f"{rng.getrandbits(256):064x}",
            8192,
            2048,
            512,
            "auto",
        )


def point_rows(runs: Iterable[PlannedRun], rng: random.Random) -> Iterator[tuple[Any, ...]]:
    for run in runs:
        if run.failed:
            continue
        node, model = run.node, run.model
        # Decode is bandwidth-bound (tokens/s ~ bandwidth / file size), prefill compute-bound.
        single = node.hardware.bandwidth_gbs * node.speed * 0.6 / model.file_gb * run.noise
        prefill = node.hardware.tflops * node.speed * 0.35e3 / (2 * model.params_b) * run.noise
        for b in CONCURRENCIES:
            s_tg = single * b**node.alpha * rng.gauss(1.0, 0.01)
            s_pp = prefill * b**0.08 * rng.gauss(1.0, 0.01)
            t_pp = PP * b / s_pp
            t_tg = TG * b / s_tg
            n_kv = b * (PP + TG)
            yield (
                run.run_id,
                PP,
                TG,
                b,
                n_kv,
                t_pp,
                s_pp,
                t_tg,
                s_tg,
                t_pp + t_tg,
                n_kv / (t_pp + t_tg),
                3,
                s_pp * 0.01,
                s_tg * 0.01,
            )


# --- filling the database ----------------------------------------------------------------

TABLE_COLUMNS = {
    "engine_builds": "id, identity, engine, build_number, commit, backend, binding, "
    "binding_version",
    "models": "id, identity, name, name_key, sha256",
    "model_facts": "id, model_id, identity, quantization, n_params, file_size",
    "nodes": "id, name, labels, created_at",
    "hardware_fingerprints": "id, node_id, hash, data, first_seen, last_seen",
    "runs": "id, reported_id, node_id, fingerprint_id, build_id, model_id, facts_id, source, "
    "status, error, "
    "started_at, finished_at, received_at, report_sha256, n_ctx, n_batch, n_ubatch, flash_attn",
    "run_points": "run_id, pp, tg, b, n_kv, t_pp, s_pp, t_tg, s_tg, t, s, repeats, "
    "s_pp_stdev, s_tg_stdev",
}


_COLUMN_TYPES = """
SELECT a.attname, t.typname
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
"""


def copy_rows(cursor: psycopg.Cursor[Any], table: str, rows: Iterable[tuple[Any, ...]]) -> int:
    """COPY in binary (about twice as fast as text), typed from the catalog."""
    columns = TABLE_COLUMNS[table]
    types = dict(cursor.execute(_COLUMN_TYPES, [table]).fetchall())
    count = 0
    with cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([types[column.strip()] for column in columns.split(",")])
        for row in rows:
            copy.write_row(row)
            count += 1
    return count


def migrate(url: str) -> None:
    """The schema at head, as `fleetbench-registry migrate` makes it."""
    from fleetbench.registry.db import create_db_engine, upgrade_schema

    engine = create_db_engine(url)
    try:
        upgrade_schema(engine)
    finally:
        engine.dispose()


def rebuild_projections(url: str) -> None:
    """The tables derived from the runs, made from the runs COPY loaded, as
    `fleetbench-registry rebuild` makes them (after restoring a backup of the runs)."""
    from fleetbench.registry.db import create_db_engine, session_factory
    from fleetbench.registry.projections import REBUILT
    from fleetbench.registry.projections.rebuild import rebuild

    engine = create_db_engine(url)
    try:
        rebuild(session_factory(engine), REBUILT)
    finally:
        engine.dispose()


BULK_TABLES = ("runs", "run_points")  # the big ones: their indexes are built after the load

_SECONDARY_INDEXES = """
SELECT pg_get_indexdef(i.indexrelid), i.indexrelid::regclass::text
FROM pg_index i
WHERE i.indrelid = ANY(%(tables)s::regclass[])
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
"""
_FOREIGN_KEYS = """
SELECT format('ALTER TABLE %%s ADD CONSTRAINT %%I %%s',
              conrelid::regclass, conname, pg_get_constraintdef(oid)),
       format('ALTER TABLE %%s DROP CONSTRAINT %%I', conrelid::regclass, conname)
FROM pg_constraint
WHERE contype = 'f' AND conrelid = ANY(%(tables)s::regclass[])
"""


@contextmanager
def indexes_built_after(cursor: psycopg.Cursor[Any], tables: Sequence[str]) -> Iterator[None]:
    """Drops the tables' secondary indexes and foreign keys, and recreates them exactly (from
    the catalog's own definitions) on exit: one sorted build instead of 1.8M index inserts
    and foreign-key probes. Same transaction, so a failed fill leaves nothing half-done."""
    params = {"tables": list(tables)}
    indexes = cursor.execute(_SECONDARY_INDEXES, params).fetchall()
    foreign_keys = cursor.execute(_FOREIGN_KEYS, params).fetchall()
    for _, drop in foreign_keys:
        cursor.execute(drop)
    for _, name in indexes:
        cursor.execute(f"DROP INDEX {name}")
    yield
    cursor.execute("SET LOCAL maintenance_work_mem = '512MB'")
    for create, _ in indexes:
        cursor.execute(create)
    for add, _ in foreign_keys:
        cursor.execute(add)


def report_step(label: str, started: float, rows: int | None = None) -> None:
    count = f"{rows:>10,} rows" if rows is not None else " " * 15
    print(f"  {label:<28} {count} {time.perf_counter() - started:7.1f} s")


def fill(url: str, shape: FleetShape) -> None:
    started = time.perf_counter()
    recreate_database(url)
    # The runs are loaded alone; the tables derived from them are rebuilt afterwards, as
    # for a registry whose runs were restored from a backup.
    migrate(url)
    report_step("recreate db + migrate", started)

    step = time.perf_counter()
    rng = random.Random(shape.seed)
    now = datetime.now(UTC)
    nodes = node_profiles(shape.nodes, rng)
    models = model_specs(shape.models)
    runs = plan_runs(nodes, models, shape, now)
    report_step("plan the fleet", step)
    tables: list[tuple[str, Iterable[tuple[Any, ...]]]] = [
        ("engine_builds", engine_build_rows()),
        ("models", model_rows(models)),
        ("model_facts", model_facts_rows(models)),
        ("nodes", node_rows(nodes, now)),
        ("hardware_fingerprints", fingerprint_rows(nodes, now)),
        ("runs", run_rows(runs, rng)),
        ("run_points", point_rows(runs, rng)),
    ]
    with psycopg.connect(libpq_url(url)) as conn, conn.cursor() as cursor:
        with indexes_built_after(cursor, BULK_TABLES):
            for table, rows in tables:
                step = time.perf_counter()
                report_step(f"COPY {table}", step, copy_rows(cursor, table, rows))
            step = time.perf_counter()
        report_step("indexes + foreign keys", step)
        for table, _ in tables[:5]:
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), max(id)) FROM {table}"
            )
        step = time.perf_counter()
    report_step("commit", step)
    step = time.perf_counter()
    rebuild_projections(url)
    report_step("rebuild (latest curves, activity, sums)", step)
    step = time.perf_counter()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    report_step("VACUUM ANALYZE", step)
    print(f"fill took {time.perf_counter() - started:.1f} s")


def fleet_is_filled(url: str, shape: FleetShape) -> bool:
    """True when the database is at the schema head and holds the fleet's row counts."""
    from fleetbench.registry.db import create_db_engine, schema_revisions

    engine = create_db_engine(url)
    try:
        current, head = schema_revisions(engine)
    except Exception:
        return False
    finally:
        engine.dispose()
    if current != head:
        return False
    with psycopg.connect(libpq_url(url)) as conn:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM nodes), (SELECT count(*) FROM models),
                      (SELECT count(*) FROM runs),
                      (SELECT count(*) FROM runs WHERE status <> 'failed'),
                      (SELECT count(*) FROM run_points)"""
        ).fetchone()
    assert row is not None
    nodes, models, runs, ok_runs, points = row
    return (nodes, models, runs, points) == (
        shape.nodes,
        shape.models,
        shape.run_count,
        ok_runs * len(CONCURRENCIES),
    )


# --- the API server ----------------------------------------------------------------------


# --- measuring ---------------------------------------------------------------------------

# How many nodes qualify, and the (node, concurrency, run id) listed, in the answer's order.
Answer = tuple[int, list[tuple[str, int, str]]]


@dataclass(frozen=True)
class Question:
    model: str
    min_tps: float
    limit: int

    @property
    def name_key(self) -> str:
        return self.model.lower().removesuffix(".gguf")


def random_questions(
    models: Sequence[str], count: int, low: float, high: float, limit: int, rng: random.Random
) -> list[Question]:
    # Thresholds log-uniform: as many slow-model as fast-model questions.
    return [
        Question(
            rng.choice(models),
            round(math.exp(rng.uniform(math.log(low), math.log(high))), 2),
            limit,
        )
        for _ in range(count)
    ]


def ask_api(client: httpx.Client, question: Question) -> tuple[float, httpx.Response]:
    params: dict[str, str | float] = {
        "model": question.model,
        "min_tps_per_user": question.min_tps,
        "limit": question.limit,
    }
    started = time.perf_counter()
    response = client.get("/v1/placement", params=params)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response


def ask_sql(
    conn: psycopg.Connection[Any], query: str, question: Question
) -> tuple[float, list[Any]]:
    params = {"name_key": question.name_key, "min_tps": question.min_tps, "limit": question.limit}
    started = time.perf_counter()
    rows = conn.execute(query, params).fetchall()
    return time.perf_counter() - started, rows


def api_answer(response: httpx.Response) -> Answer:
    body = response.json()
    return body["count"], [(c["node"], c["concurrency"], c["run_id"]) for c in body["candidates"]]


def sql_answer(rows: Sequence[Any]) -> Answer:
    return (rows[0][10] if rows else 0), [(row[0], row[1], str(row[9])) for row in rows]


def verify(question: Question, api: Answer, sql: Answer) -> None:
    if api == sql:
        return
    (api_count, api_list), (sql_count, sql_list) = api, sql
    pairs = enumerate(zip(api_list, sql_list, strict=False))
    first = next((i for i, (a, s) in pairs if a != s), min(len(api_list), len(sql_list)))
    print(
        f"\nWRONG ANSWER for {question}: API counts {api_count} and lists {len(api_list)}, "
        f"SQL {sql_count} and {len(sql_list)}; first difference at #{first}: "
        f"API {api_list[first : first + 1]} SQL {sql_list[first : first + 1]}",
        file=sys.stderr,
    )
    raise SystemExit(1)


@dataclass
class Samples:
    api_ms: list[float]
    sql_ms: list[float]  # the hand-written query over the latest curves
    old_sql_ms: list[float]  # the hand-written query over the runs
    candidates: list[int]
    verified: int = 0


def measure(
    client: httpx.Client,
    conn: psycopg.Connection[Any],
    questions: Sequence[Question],
    *,
    warmup: int,
    verify_every: int,
) -> Samples:
    """Each question three ways, their order rotating from one question to the next, so
    that noise and cache warmth hit all alike."""
    samples = Samples([], [], [], [])
    for i, question in enumerate(questions):
        asked: dict[str, Any] = {}
        ways: list[tuple[str, Callable[[], Any]]] = [
            ("api", functools.partial(ask_api, client, question)),
            ("sql", functools.partial(ask_sql, conn, LATEST_SQL, question)),
            ("old", functools.partial(ask_sql, conn, PLACEMENT_SQL, question)),
        ]
        for name, ask in ways[i % 3 :] + ways[: i % 3]:
            asked[name] = ask()
        (api_s, response), (sql_s, rows), (old_s, old_rows) = (
            asked["api"],
            asked["sql"],
            asked["old"],
        )
        measured = i - warmup
        if measured < 0 or measured % verify_every == 0:
            verify(question, api_answer(response), sql_answer(rows))
            verify(question, sql_answer(old_rows), sql_answer(rows))
            samples.verified += 1
        if measured >= 0:
            samples.api_ms.append(api_s * 1000)
            samples.sql_ms.append(sql_s * 1000)
            samples.old_sql_ms.append(old_s * 1000)
            samples.candidates.append(sql_answer(rows)[0])
    return samples


# --- reporting ---------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_report(samples: Samples, limit: int, target_p99_ms: float) -> dict[str, object]:
    """Prints the figures; returns them for the run's result file."""
    api, sql, old = samples.api_ms, samples.sql_ms, samples.old_sql_ms
    latency: dict[str, dict[str, float]] = {}
    print(
        f"\n{len(api)} measured questions, {samples.verified} verified; nodes qualifying per "
        f"answer: min {min(samples.candidates)}, median "
        f"{statistics.median(samples.candidates):.0f}, max {max(samples.candidates)}; at most "
        f"{limit} listed"
    )
    print(
        f"\n{'':>6} {'API ms':>9} {'SQL ms':>9} {'API/SQL':>8}   {'SQL over runs ms':>17}"
        "   (SQL: hand-written, over the latest curves)"
    )
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)):
        a, s_, o = percentile(api, q), percentile(sql, q), percentile(old, q)
        print(f"{label:>6} {a:>9.2f} {s_:>9.2f} {a / s_:>8.2f}   {o:>17.2f}")
        latency[label] = {"api_ms": a, "sql_ms": s_, "api_over_sql": a / s_, "old_sql_ms": o}
    api_p99 = percentile(api, 0.99)
    ratio_p50 = percentile(api, 0.5) / percentile(sql, 0.5)
    ratio_p99 = api_p99 / percentile(sql, 0.99)
    print("\ntargets")
    print(
        f"  API p99 <= {target_p99_ms:g} ms      {api_p99:8.2f} ms  "
        f"{verdict(api_p99 <= target_p99_ms)}"
    )
    for label, ratio in (("p50", ratio_p50), ("p99", ratio_p99)):
        print(
            f"  API/SQL at {label} <= {TARGET_RATIO:g}  {ratio:8.2f}     "
            f"{verdict(ratio <= TARGET_RATIO)}"
        )
    return {
        "questions": len(api),
        "verified": samples.verified,
        "qualifying_nodes": {
            "min": min(samples.candidates),
            "median": statistics.median(samples.candidates),
            "max": max(samples.candidates),
        },
        "limit": limit,
        "latency": latency,
        "targets": {
            "api_p99_ms": {"target": target_p99_ms, "met": api_p99 <= target_p99_ms},
            "api_over_sql_p50": {"target": TARGET_RATIO, "met": ratio_p50 <= TARGET_RATIO},
            "api_over_sql_p99": {"target": TARGET_RATIO, "met": ratio_p99 <= TARGET_RATIO},
        },
    }


# --- main --------------------------------------------------------------------------------


def model_names(url: str) -> list[str]:
    with psycopg.connect(libpq_url(url)) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM models ORDER BY id")]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shape = FleetShape(args.nodes, args.models, args.runs, args.fail_rate, args.seed)
    url = args.database_url
    print(
        f"fleet: {shape.nodes:,} nodes x {shape.models} models x {shape.runs} runs x "
        f"{len(CONCURRENCIES)} concurrencies (PP={PP} TG={TG}) in {make_url(url).database}"
    )
    if args.reuse and fleet_is_filled(url, shape):
        print("reusing the filled database (--reuse; row counts match)")
    else:
        fill(url, shape)

    models = model_names(url)
    rng = random.Random(args.seed)
    questions = random_questions(
        models, args.warmup + args.pairs, args.min_tps, args.max_tps, args.limit, rng
    )
    process, base_url = start_registry(url)
    try:
        with (
            httpx.Client(base_url=base_url, timeout=30) as client,
            psycopg.connect(libpq_url(url), autocommit=True) as conn,
        ):
            samples = measure(
                client, conn, questions, warmup=args.warmup, verify_every=args.verify_every
            )
    finally:
        stop_registry(process)
    target = args.target_p99_ms or (50.0 if args.runs >= 100 else 25.0)
    figures = print_report(samples, args.limit, target)
    fleet = {
        "nodes": shape.nodes,
        "models": shape.models,
        "runs_per_node_and_model": shape.runs,
        "runs": shape.run_count,
        "concurrencies": len(CONCURRENCIES),
    }
    write_result("placement_latency", {"fleet": fleet, **figures}, arguments=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
