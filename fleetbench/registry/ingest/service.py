"""The ingest the application holds: reports submitted from request handlers, stored by
the writer's threads in batched transactions (registry.writer)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sqlalchemy.orm import Session, sessionmaker

from fleetbench.contract import wire
from fleetbench.registry.ingest.answers import IngestLimits, Stored, check_size
from fleetbench.registry.ingest.batch import ingest_batch
from fleetbench.registry.ingest.rows import KnownRows
from fleetbench.registry.series_cache import SeriesCache
from fleetbench.registry.writer import Batch, Writer


class Ingest:
    """Stores reports through the writer (registry.writer): in batches, each batch one
    transaction, on one thread for SQLite and `writers` threads for PostgreSQL.

    ingest = Ingest(sessions, IngestLimits(), writers=4)
    stored = await ingest.submit(report, node_id=7)   # committed when it returns
    ingest.close()
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        limits: IngestLimits,
        *,
        writers: int = 1,
        batch: int = 32,
    ) -> None:
        self.limits = limits
        self._known = KnownRows()
        self._learning = threading.Lock()
        self._series = SeriesCache()
        threads = 1 if sessions.kw["bind"].dialect.name == "sqlite" else writers
        self._writer: Writer[tuple[wire.RunReport, int], Stored] = Writer(
            sessions, self._write, threads=threads, batch=batch
        )

    async def submit(self, report: wire.RunReport, *, node_id: int) -> Stored:
        """Stores the report as a run of the node; raises RunConflict or ReportRefused."""
        check_size(report, self.limits)
        return await self._writer.submit((report, node_id))

    def close(self) -> None:
        self._writer.close()

    def _write(
        self, session: Session, items: Sequence[tuple[wire.RunReport, int]]
    ) -> Batch[Stored]:
        with self._learning:
            known = KnownRows(dict(self._known.builds), dict(self._known.models))
        learned = KnownRows()
        answers = ingest_batch(
            session,
            items,
            limits=self.limits,
            known=known,
            learned=learned,
            series_cache=self._series,
        )

        def remember() -> None:
            with self._learning:
                self._known.learn(learned)
            for node_id, (before, after, models) in learned.series.items():
                self._series.committed(
                    node_id, changes_before=before, changes_after=after, models=models
                )

        return Batch(answers, committed=remember)
