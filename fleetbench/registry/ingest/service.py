"""The ingest the application holds: reports submitted from request handlers, stored by
the writer's threads in batched transactions (registry.writer)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session, sessionmaker

from fleetbench.contract import wire
from fleetbench.registry.costs import Steps
from fleetbench.registry.ingest.answers import IngestLimits, Stored, check_size
from fleetbench.registry.ingest.batch import ingest_batch
from fleetbench.registry.ingest.rows import KnownRows
from fleetbench.registry.writer import Batch, Writer


class Ingest:
    """Stores reports through the writer (registry.writer): in batches, each batch one
    transaction, on one thread for SQLite and `writers` threads for PostgreSQL.
    `stored` is told after each commit that stored runs (their series are queued for the
    regression check), `measured` what each committed batch cost (registry.costs); `known`
    holds the rows it learns (the process's, registry.state).

    ingest = Ingest(sessions, IngestLimits(), writers=4, stored=judge.queued)
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
        linger: float = 0.0,
        stored: Callable[[], None] | None = None,
        measured: Callable[[Steps], None] | None = None,
        known: KnownRows | None = None,
    ) -> None:
        self.limits = limits
        self._known = known if known is not None else KnownRows()
        self._learning = threading.Lock()
        self._stored = stored
        self._measured = measured
        threads = 1 if sessions.kw["bind"].dialect.name == "sqlite" else writers
        self._writer: Writer[tuple[wire.RunReport, int], Stored] = Writer(
            sessions, self._write, threads=threads, batch=batch, linger=linger
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
            known = KnownRows(
                dict(self._known.builds), dict(self._known.models), dict(self._known.facts)
            )
        learned = KnownRows()
        steps = Steps()
        answers = ingest_batch(
            session, items, limits=self.limits, known=known, learned=learned, steps=steps
        )
        created = any(isinstance(answer, Stored) and answer.created for answer in answers)

        def committed() -> None:
            with self._learning:
                self._known.learn(learned)
            if created and self._stored is not None:
                self._stored()
            if self._measured is not None:
                self._measured(steps)

        return Batch(answers, committed=committed, steps=steps)
