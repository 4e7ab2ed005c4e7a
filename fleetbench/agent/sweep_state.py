"""What each sweep last succeeded with, beside the spool: the daemon sweeps again at once
when the engine or the model changed since (agent.daemon)."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from fleetbench.agent.runners.llama_cpp_python import BINDING

__all__ = ["SweepState"]

log = logging.getLogger("fleetbench.daemon")

# The table and its engine column, newest first (an older agent's last).
_SUCCESS_TABLES = (("sweep_successes", "engine"), ("last_success", "llama_cpp_python"))


class SweepState:
    """The engine and model each sweep last succeeded with (beside the spool), the engine
    as whatever identity its runner gives (`{"llama-cpp-python": "0.3.36"}`,
    `{"llama-batched-bench": "7100 0c1e570 CPU"}`), kept as JSON. The table is made by the
    first success, so a daemon starts on a full disk; a success that cannot be recorded is a
    warning (the next check sweeps again), not a crash. Rows of older agents' table
    (`last_success`, whose column held llama-cpp-python's version alone, or that JSON) are
    read until the sweep succeeds again."""

    _TABLE = (
        "CREATE TABLE IF NOT EXISTS sweep_successes (sweep TEXT PRIMARY KEY,"
        " engine TEXT NOT NULL, model_sha256 TEXT, at REAL)"
    )

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def record(self, sweep: str, identity: dict[str, str]) -> None:
        engine = {k: v for k, v in identity.items() if k != "model_sha256"}
        try:
            with self._connect() as db:
                db.execute(self._TABLE)
                db.execute(
                    "INSERT OR REPLACE INTO sweep_successes VALUES (?, ?, ?, ?)",
                    (
                        sweep,
                        json.dumps(engine, sort_keys=True),
                        identity.get("model_sha256"),
                        datetime.now(UTC).timestamp(),
                    ),
                )
        except sqlite3.OperationalError as exc:
            log.warning("sweep %s: its success cannot be recorded in %s: %s", sweep, self.path, exc)

    def last(self, sweep: str) -> dict[str, str] | None:
        if not self.path.exists():
            return None
        row = None
        with self._connect() as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
            for table, column in _SUCCESS_TABLES:
                if row is None and table in tables:
                    row = db.execute(
                        f"SELECT {column}, model_sha256 FROM {table} WHERE sweep = ?", (sweep,)
                    ).fetchone()
        if row is None:
            return None
        try:
            engine = json.loads(row[0])
        except ValueError:
            engine = None
        if not isinstance(engine, dict):  # recorded by an older agent: the version alone
            engine = {BINDING: row[0]}
        return {**engine, "model_sha256": row[1]}
