"""The writer: reports are stored by threads of their own, in batches that each share one
transaction.

A request hands its validated report to the writer and awaits the answer. Each writer thread
takes whatever reports are waiting (up to `batch`), and those that arrive within `linger`
seconds of the first, and stores them in one transaction: one connection checkout, BEGIN and
COMMIT (one fsync on SQLite) and one of each statement for the lot, whose cost does not grow
with it. A report refused on its own merits (a conflicting run id, a bound) is refused before
it writes anything, so it never undoes the others; if the transaction fails anyway (a
deadlock, a lost connection), each of its reports is stored again alone, so one bad report
never fails another. Nothing is answered before the commit that holds it.

SQLite has one writer at a time: there, one thread writes, back to back, and never hands the
database's lock to a thread that must first win the GIL back. PostgreSQL gets `threads`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from fleetbench.registry.costs import Steps
from fleetbench.registry.db import write_transaction

__all__ = ["Batch", "Writer"]

log = logging.getLogger("fleetbench.registry.writer")

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class Batch(Generic[Result]):
    """What a batch's write function gives back: each item's answer (a result, or the
    exception that refused it alone), what to do once the transaction is committed, and
    where to count what the commit cost (registry.costs)."""

    answers: list[Result | Exception]
    committed: Callable[[], None] | None = None
    steps: Steps | None = None


@dataclass(frozen=True)
class _Job(Generic[Item, Result]):
    item: Item
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Result]


class Writer(Generic[Item, Result]):
    """
    writer = Writer(sessions, write, threads=4, batch=32, linger=0.025)
    result = await writer.submit(item)   # write(session, [item, ...]) in a committed batch
    writer.close()

    `write(session, items)` writes the items in the session's transaction, without
    committing, and answers each; an item it refuses with an exception must have written
    nothing. An exception `write` raises fails the transaction: its items are then written
    again one at a time."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        write: Callable[[Session, Sequence[Item]], Batch[Result]],
        *,
        threads: int,
        batch: int,
        linger: float = 0.0,
    ) -> None:
        self.sessions = sessions
        self.write = write
        self.batch = batch
        self.linger = linger
        self._jobs: queue.SimpleQueue[_Job[Item, Result] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"writer-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        job: _Job[Item, Result] = _Job(item, loop, loop.create_future())
        self._jobs.put(job)
        return await job.future

    def close(self) -> None:
        """Stores what was submitted, then stops the threads."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            try:
                batch = self._commit(jobs)
            except Exception as exc:  # the transaction failed
                if len(jobs) == 1:
                    _settle(jobs[0], exc)
                    continue
                log.warning("a batch of %d reports failed (%s); storing each alone", len(jobs), exc)
                for job in jobs:
                    try:
                        self._answer([job], self._commit([job]))
                    except Exception as alone:
                        _settle(job, alone)
            else:
                self._answer(jobs, batch)

    def _take(self) -> list[_Job[Item, Result]] | None:
        """The jobs waiting now and those that come within `linger` of the first (at least
        one, at most `batch`); None to stop."""
        first = self._jobs.get()
        if first is None:
            return None
        jobs = [first]
        until = time.monotonic() + self.linger
        while len(jobs) < self.batch:
            try:
                job = self._jobs.get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                break
            if job is None:  # closing: this batch first, then stop
                self._jobs.put(None)
                break
            jobs.append(job)
        return jobs

    def _commit(self, jobs: list[_Job[Item, Result]]) -> Batch[Result]:
        with self.sessions() as session, write_transaction(session):
            batch = self.write(session, [job.item for job in jobs])
            with batch.steps.step("commit") if batch.steps is not None else nullcontext():
                session.commit()
        return batch

    @staticmethod
    def _answer(jobs: list[_Job[Item, Result]], batch: Batch[Result]) -> None:
        """After the commit: nothing here may send a stored batch to be stored again."""
        if batch.committed is not None:
            try:
                batch.committed()
            except Exception:
                log.exception("after a commit")  # what it remembers is only a cache
        answers: Sequence[Result | Exception] = batch.answers
        if len(answers) != len(jobs):  # never expected; a thread that died would jam
            answers = [RuntimeError("the writer lost this report's answer")] * len(jobs)
        for job, answer in zip(jobs, answers, strict=True):
            _settle(job, answer)


def _settle(job: _Job[Item, Result], answer: Result | Exception) -> None:
    """Gives the job's request its answer, on the request's own event loop."""

    def settle() -> None:
        if job.future.done():  # the request went away meanwhile
            return
        if isinstance(answer, Exception):
            job.future.set_exception(answer)
        else:
            job.future.set_result(answer)

    with contextlib.suppress(RuntimeError):  # its event loop has closed
        job.loop.call_soon_threadsafe(settle)
