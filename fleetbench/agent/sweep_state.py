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

__all__ = ["SweepState"]

log = logging.getLogger("fleetbench.daemon")


class SweepState:
    """The engine and model each sweep last succeeded with (beside the spool), the engine
    as whatever identity its runner gives (`{"llama-cpp-python": "0.3.36"}`,
    `{"llama-batched-bench": "7100 0c1e570 CPU"}`), kept as JSON. The table is made by the
    first success, so a daemon starts on a full disk; a success that cannot be recorded is a
    warning (the next check sweeps again), not a crash."""

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
        with self._connect() as db:
            made = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sweep_successes'")
            if made.fetchone() is None:  # no success recorded yet (read only: a full disk)
                return None
            row = db.execute(
                "SELECT engine, model_sha256 FROM sweep_successes WHERE sweep = ?", (sweep,)
            ).fetchone()
        if row is None:
            return None
        engine = json.loads(row[0])
        return {**engine, "model_sha256": row[1]}
