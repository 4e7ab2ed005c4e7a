"""The fleet bench/load.py plays: its nodes' fingerprints and reports, the database it
starts from (tokens, and a history of runs in every node's series), and what it reads
back."""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select, text

from bench.common import recreate_database
from fleetbench.contract.wire import SCHEMA_VERSION
from fleetbench.registry.db import create_db_engine, session_factory, upgrade_schema
from fleetbench.registry.models import Run
from fleetbench.registry.tokens import create_node_token

__all__ = [
    "MODEL",
    "node_name",
    "prepare_database",
    "queued_checks",
    "report",
    "seed_history",
    "stored_run_ids",
]

MODEL = "Meta-Llama-3.1-8B-Instruct-Q4_K_M"
CONCURRENCIES = (1, 2, 4, 8, 16, 32)
DAY0 = datetime(2026, 11, 1, tzinfo=UTC)


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


def report(node: int, minute: int, rng: random.Random) -> dict[str, Any]:
    """A distinct 6-point run of `node` started `minute` minutes after DAY0: a fresh id,
    its own speeds."""
    started = DAY0 + timedelta(minutes=minute)
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
        "schema_version": SCHEMA_VERSION,
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


def prepare_database(database: str, url: str, work: Path, nodes: int) -> tuple[str, list[str]]:
    """A fresh database (a SQLite file in `work`, or the PostgreSQL database `url`,
    recreated), migrated, with one node and token per node; its URL and the tokens."""
    if database == "sqlite":
        url = f"sqlite:///{work / 'registry.db'}"
    else:
        recreate_database(url)
    engine = create_db_engine(url)
    upgrade_schema(engine)
    with session_factory(engine)() as session:
        secrets = [
            create_node_token(session, node_name=node_name(node), labels={})
            for node in range(nodes)
        ]
        session.commit()
    engine.dispose()
    return url, secrets


# Each node's seeded run, cloned `history` times a minute apart before it: new ids made from
# the clone's number (md5 on PostgreSQL; on SQLite, whose UUIDs are 32 hex digits, the
# number in the last 8), its points cloned with it.
_NUMBERS = {
    "postgresql": "generate_series(1, :history) AS n(i)",
    "sqlite": "(WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c "
    "WHERE i < :history) SELECT i FROM c) AS n",
}
_NEW_ID = {
    "postgresql": "md5({column}::text || '/' || n.i)::uuid",
    "sqlite": "substr({column}, 1, 24) || printf('%08x', n.i)",
}
_EARLIER = {
    "postgresql": "{column} - make_interval(mins => n.i)",
    "sqlite": "strftime('%Y-%m-%d %H:%M:%f', {column}, printf('-%d minutes', n.i)) || '000'",
}
_RENAMED = {"id", "reported_id", "run_id"}
_MOVED = {"started_at", "finished_at", "received_at"}


def _clone_statement(engine: Engine, table: str, key: str) -> str:
    dialect = engine.dialect.name
    with engine.connect() as connection:
        columns = list(connection.exec_driver_sql(f"SELECT * FROM {table} LIMIT 0").keys())
    if table == "run_points":
        columns = [c for c in columns if c != "id"]  # its own serial
    picked = []
    for column in columns:
        if column in _RENAMED:
            picked.append(_NEW_ID[dialect].format(column=f"t.{column}"))
        elif column in _MOVED:
            picked.append(_EARLIER[dialect].format(column=f"t.{column}"))
        else:
            picked.append(f"t.{column}")
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(picked)} "
        f"FROM {table} AS t CROSS JOIN {_NUMBERS[dialect]} WHERE t.{key} = :run_id"
    )


def seed_history(url: str, history: int) -> None:
    """Gives every node `history` more runs of its model, a minute apart and older than
    all it has (what years of sweeps leave), one node per transaction, with progress."""
    engine = create_db_engine(url)
    clone_runs = text(_clone_statement(engine, "runs", "id"))
    clone_points = text(_clone_statement(engine, "run_points", "run_id"))
    with engine.connect() as connection:
        seeds = connection.execute(select(Run.id, Run.node_id).order_by(Run.node_id)).all()
    began = time.monotonic()
    for done, (run_id, node_id) in enumerate(seeds, start=1):
        params = {"run_id": run_id if engine.dialect.name == "postgresql" else run_id.hex}
        with engine.begin() as connection:
            connection.execute(clone_runs.bindparams(history=history), params)
            connection.execute(clone_points.bindparams(history=history), params)
            connection.execute(
                text("UPDATE node_activity SET run_count = run_count + :n WHERE node_id = :node"),
                {"n": history, "node": node_id},
            )
        print(
            f"\r  history: {done}/{len(seeds)} nodes, {done * history:,} runs "
            f"({time.monotonic() - began:.0f} s)",
            end="",
            flush=True,
        )
    print()
    with engine.begin() as connection:  # the planner's statistics, as after years of use
        connection.exec_driver_sql("ANALYZE")
    engine.dispose()


def stored_run_ids(url: str, *, received_since: datetime) -> set[str]:
    """The ids of the runs the registry received since then."""
    engine = create_db_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(select(Run.id).where(Run.received_at >= received_since)).scalars()
        ids = {str(run_id) for run_id in rows}
    engine.dispose()
    return ids


def queued_checks(engine: Engine) -> int:
    """Series checks the registry's judges have yet to finish."""
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM series_checks")).scalar_one())
