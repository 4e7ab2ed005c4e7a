"""The daemon's delivery: every run it measured reaches the registry, or waits on disk
(the spool) until it can; when the disk is full too, in memory and in the log, delivered
straight to the registry if the spool still cannot take it. A registry that was down is
asked its /healthz before each round, so a fleet's queued runs go as soon as it answers."""

from __future__ import annotations

import logging

from fleetbench.agent.client import RegistryClient
from fleetbench.agent.config import AgentSettings
from fleetbench.agent.errors import ClientError, RequestRejected, SpoolUnwritable
from fleetbench.agent.spool import RETRYABLE_STATUS, Spool
from fleetbench.contract.wire import RunReport

__all__ = ["Delivery"]

log = logging.getLogger("fleetbench.daemon")


class Delivery:
    def __init__(self, spool: Spool, settings: AgentSettings) -> None:
        self.spool = spool
        self._settings = settings
        self.unspooled: list[RunReport] = []  # runs a full disk kept out of the spool
        self._registry_down = True  # until a flush says otherwise: probe it when in doubt

    def keep(self, report: RunReport, sweep: str) -> None:
        """Puts a measured run in the spool; a full disk keeps it in memory until space
        is back, and in the log meanwhile, so that even a stopped daemon loses nothing."""
        try:
            self.spool.add(report)
        except SpoolUnwritable as exc:
            self.unspooled.append(report)
            log.error(
                "sweep %s: run %s kept in memory, %s: %s",
                sweep,
                report.run_id,
                exc,
                report.model_dump_json(),
            )

    def flush(self, registry_url: str) -> None:
        """Writes the runs kept in memory to the spool, then delivers what is due. When runs
        wait out a backoff because the registry was down, asks its /healthz: answering
        again, every queued run goes now. A full disk is one line in the log."""
        try:
            self._spool_kept_runs()
        except SpoolUnwritable as exc:
            log.error("delivery waits: %s", exc)
            self._deliver_kept_runs(registry_url)
            return
        try:
            with RegistryClient(registry_url, token=self._settings.current_token()) as client:
                result = self.spool.flush(client)
                tried = result.delivered + result.rejected + result.deferred
                if not tried and self._registry_down and self.spool.counts()["queued"]:
                    if not client.healthy():
                        return
                    log.info("the registry answers again: delivering every queued run")
                    result = self.spool.flush(client, every_queued=True)
                    tried = result.delivered + result.rejected + result.deferred
        except SpoolUnwritable as exc:
            log.error("delivery waits: %s", exc)
            return
        if tried:
            self._registry_down = result.registry_down
            log.info(
                "delivery: %d delivered, %d rejected, %d waiting",
                result.delivered,
                result.rejected,
                result.deferred,
            )

    def _deliver_kept_runs(self, registry_url: str) -> None:
        """The spool cannot take the runs kept in memory: they go to the registry directly,
        so that a daemon stopped before space is back loses none the registry could take."""
        with RegistryClient(registry_url, token=self._settings.current_token()) as client:
            while self.unspooled:
                report = self.unspooled[0]
                try:
                    client.submit_run(report)
                except RequestRejected as exc:
                    if exc.status_code in RETRYABLE_STATUS:
                        log.warning("run %s stays in memory: %s", report.run_id, exc)
                        return
                    log.error("run %s, kept in memory, was refused: %s", report.run_id, exc)
                except ClientError as exc:
                    log.warning("run %s stays in memory: %s", report.run_id, exc)
                    return
                else:
                    log.info("run %s, kept in memory, was delivered directly", report.run_id)
                self.unspooled.pop(0)

    def _spool_kept_runs(self) -> None:
        """Moves the runs kept in memory into the spool; raises SpoolUnwritable while it
        still cannot take them."""
        while self.unspooled:
            report = self.unspooled[0]
            self.spool.add(report)
            self.unspooled.pop(0)
            log.info("run %s, kept in memory, is in the spool now", report.run_id)
