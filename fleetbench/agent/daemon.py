"""`fleetbench-agent daemon`: scheduled sweeps, delivered without loss, unattended.

Each configured sweep, of agent.toml's `[[sweep]]` and `[[serve_sweep]]` tables and of the
registry's plans for this node (agent.plans, pulled every few minutes), runs on its cron
schedule (with random jitter, so a fleet does not sweep in the same second), and at once
when what it measures changed since its last successful run (the llama.cpp build or the
model file; a server's build), so a regression after an upgrade shows the next morning; the
plans' also when an admin asks the node to sweep now. Never two sweeps at once: one worker
thread in the process, a file lock across processes. While other work holds the CPU or GPU
above a threshold an offline sweep is postponed, and while a server is serving others'
requests its serving sweep is, saying why: benchmarks neither disturb production nor get
polluted by it. Work that starts during a sweep is watched for (agent.contention): a run
it disturbed is marked as measured under contention, and the registry keeps it apart.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

from fleetbench.agent.client import RegistryClient
from fleetbench.agent.config import open_spool
from fleetbench.agent.contention import ContentionThresholds, judged_report
from fleetbench.agent.daemon_config import (
    ConfigError,
    DaemonConfig,
    ScheduledSweep,
    ServeSweepConfig,
    SweepConfig,
    load_config,
)
from fleetbench.agent.delivery import Delivery
from fleetbench.agent.plans import PLAN_PREFIX, PlanCache, PlannedSweep, pull_plans, resolve_plan
from fleetbench.agent.probes.nvidia import busiest_gpu_percent
from fleetbench.agent.sweep import sweep_lock
from fleetbench.agent.sweep_state import SweepState
from fleetbench.contract.accelerator import run_off_accelerator
from fleetbench.contract.plans import NodePlans, NodeStatus, PlanState

__all__ = [
    "ConfigError",
    "Daemon",
    "DaemonConfig",
    "ServeSweepConfig",
    "SweepConfig",
    "load_config",
]

log = logging.getLogger("fleetbench.daemon")
# Scheduler job ids: a sweep's, and its postponed retry's (the daemon's own jobs, "flush"
# and "plans", cannot meet a sweep's name).
_SWEEP_JOB, _RETRY_JOB = "sweep:", "retry:"


def busy_reason(
    *,
    cpu_percent: float,
    gpu_percent: float | None,
    cpu_limit: float,
    gpu_limit: float,
) -> str | None:
    if cpu_percent > cpu_limit:
        return f"CPU {cpu_percent:.0f}% busy (limit {cpu_limit:.0f}%)"
    if gpu_percent is not None and gpu_percent > gpu_limit:
        return f"GPU {gpu_percent:.0f}% busy (limit {gpu_limit:.0f}%)"
    return None


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        *,
        load: Callable[[], tuple[float, float | None]] | None = None,
    ) -> None:
        self.config = config
        self.settings = settings = config.settings
        self.node = settings.node
        self.registry_url = settings.registry_url
        self.spool = open_spool(settings)
        self.lock_path = self.spool.path.with_name("sweep.lock")
        self.sha256_cache = settings.cache_dir / "sha256.json"
        self.load = load or (lambda: (psutil.cpu_percent(interval=1.0), busiest_gpu_percent()))
        self._state = SweepState(self.spool.path.with_name("sweeps.db"))
        self.plan_cache = PlanCache(self.spool.path.with_name("plans.json"))
        self._plans = self.plan_cache.load() if settings.plans else None  # (etag, plans)
        self.planned: dict[str, PlannedSweep] = {}  # by plan name
        self._last_runs: dict[str, tuple[datetime, str]] = {}  # by sweep name
        self._swept_now: datetime | None = None  # the sweep-now request last run
        self.scheduler: Any = None
        self.delivery = Delivery(self.spool, settings)

    # --- one sweep ----------------------------------------------------------------------

    def run_sweep(self, sweep: ScheduledSweep, *, why: str) -> str:
        """Runs one sweep now unless the machine (for an offline sweep) or the server (for
        a serving one) is busy or another sweep holds the lock; returns what happened.
        Never raises: a failed sweep is a failed run, reported."""
        if sweep.busy_guard:
            cpu, gpu = self.load()
            busy = busy_reason(
                cpu_percent=cpu,
                gpu_percent=gpu,
                cpu_limit=self.settings.busy_cpu_percent,
                gpu_limit=self.settings.busy_gpu_percent,
            )
            if busy is not None:
                self._postpone(sweep, f"postponed {sweep.name} ({why}): {busy}")
                return "postponed: " + busy
        with sweep_lock(self.lock_path) as acquired:
            if not acquired:
                self._postpone(sweep, f"postponed {sweep.name} ({why}): another sweep is running")
                return "postponed: another sweep is running"
            log.info("sweep %s starts (%s)", sweep.name, why)
            planned = sweep.name.startswith(PLAN_PREFIX)
            if planned:  # its next run moves on now: a long sweep is no missed schedule
                self.report_status()
            status = self._sweep(sweep)
        self.flush()
        if planned:
            self.report_status()
        return status

    def _sweep(self, sweep: ScheduledSweep) -> str:
        try:
            report = sweep.measure(self.node, self.sha256_cache)
        except Exception:  # no sweep may stop the daemon's one thread (nor its next jobs)
            log.exception("sweep %s failed before it made a run", sweep.name)
            self._last_runs[sweep.name] = (datetime.now(UTC), "failed")
            return "failed"
        if isinstance(report, str):  # the server is serving others: measured nothing
            self._postpone(sweep, f"postponed {sweep.name}: {report}")
            return "postponed: " + report
        report = judged_report(report, ContentionThresholds.of(self.settings))
        self.delivery.keep(report, sweep.name)
        log.info("sweep %s: run %s %s", sweep.name, report.run_id, report.status)
        if report.contention is not None and report.contention.reason is not None:
            log.warning(
                "sweep %s measured under contention (kept out of placement and regression "
                "baselines): %s",
                sweep.name,
                report.contention.reason,
            )
        if (why := run_off_accelerator(report)) is not None:
            log.warning("sweep %s measured the CPU, not the GPU: %s", sweep.name, why)
        self._last_runs[sweep.name] = (report.started_at, report.status)
        if report.status != "failed" and (identity := sweep.identity(self.sha256_cache)):
            self._state.record(sweep.name, identity)
        return report.status

    def _postpone(self, sweep: ScheduledSweep, message: str) -> None:
        log.warning(message)
        self._last_runs[sweep.name] = (datetime.now(UTC), "postponed")
        if self.scheduler is not None:
            self.scheduler.add_job(
                self.run_sweep,
                "date",
                run_date=datetime.now(UTC) + timedelta(seconds=self.settings.busy_retry_s),
                args=[sweep],
                kwargs={"why": "postponed"},
                id=_RETRY_JOB + sweep.name,
                replace_existing=True,
            )

    # --- changes since the last success ---------------------------------------------------

    def changed_since_last_success(self, sweep: ScheduledSweep) -> str | None:
        """Why the sweep should run now: what its results depend on (the engine and model;
        a server's build) changed since it last succeeded (or it never did). None when
        nothing changed, or when that cannot be told now (a server that does not answer)."""
        now = sweep.identity(self.sha256_cache)
        if now is None:
            return None
        before = self._state.last(sweep.name)
        if before is None:
            return "no successful run yet"
        changed = [f"{k} {before.get(k)} -> {v}" for k, v in now.items() if before.get(k) != v]
        return "changed: " + ", ".join(changed) if changed else None

    def sweeps(self) -> list[ScheduledSweep]:
        """agent.toml's sweeps, then the plans' this node runs."""
        planned: list[ScheduledSweep] = [
            p.sweep for p in self.planned.values() if p.sweep is not None
        ]
        return [*self.config.sweeps, *planned]

    def check_changes(self) -> None:
        for sweep in self.sweeps():
            if (why := self.changed_since_last_success(sweep)) is not None:
                self.run_sweep(sweep, why=why)

    def flush(self) -> None:
        self.delivery.flush(self.registry_url)

    # --- the registry's plans --------------------------------------------------------------

    def poll_plans(self) -> None:
        """Pulls the plans (unchanged: a 304), schedules what changed, runs every plan now
        when an admin asked for it since the last time, and tells the registry how they
        fare. A registry that cannot be reached changes nothing."""
        with RegistryClient(self.registry_url, token=self.settings.current_token()) as client:
            self._plans = pull_plans(client, self.plan_cache, self._plans)
        if self._plans is None:
            return
        plans = self._plans[1]
        self.apply_plans(plans)
        asked = plans.sweep_now
        if asked is not None and (self._swept_now is None or asked > self._swept_now):
            log.info("an admin asked for a sweep now (%s): every plan runs", asked)
            for planned in list(self.planned.values()):
                if planned.sweep is not None:
                    self.run_sweep(planned.sweep, why="an admin asked to sweep now")
            self._swept_now = asked
        self.report_status()

    def apply_plans(self, plans: NodePlans) -> None:
        """Resolves each plan on this node and (re)schedules the plan sweeps that changed."""
        before = self.planned
        self.planned = {
            plan.name: resolve_plan(
                plan,
                sha256_cache=self.sha256_cache,
                allowed_binaries=self.settings.plan_binaries,
                allowed_model_dirs=self.settings.plan_model_dirs,
                allowed_servers=self.settings.plan_serve_urls,
            )
            for plan in plans.plans
        }
        changed = {
            name
            for name in before.keys() | self.planned.keys()
            if _sweep_of(before.get(name)) != _sweep_of(self.planned.get(name))
        }
        for name in sorted(changed):
            planned = self.planned.get(name)
            if planned is None:
                log.info("plan %s no longer runs here", name)
            elif planned.skipped is not None:
                log.warning("plan %s v%d skipped: %s", name, planned.plan.version, planned.skipped)
            else:
                log.info("plan %s v%d runs at %r", name, planned.plan.version, planned.plan.cron)
            if self.scheduler is None:
                continue
            for job in (_SWEEP_JOB, _RETRY_JOB):  # a postponed run of the old one too
                if self.scheduler.get_job(job + PLAN_PREFIX + name) is not None:
                    self.scheduler.remove_job(job + PLAN_PREFIX + name)
            if planned is not None and planned.sweep is not None:
                self._schedule_sweep(planned.sweep)

    def report_status(self) -> None:
        """Tells the registry each plan's version, skip, last and next run. Best effort,
        never raising: the next poll tells it again."""
        if self._plans is None:
            return
        try:
            status = self._status(datetime.now(UTC))
            with RegistryClient(self.registry_url, token=self.settings.current_token()) as c:
                c.report_status(status)
        except Exception as exc:  # a status is never worth stopping a sweep or a poll
            log.warning("plan status not reported: %s", exc)

    def _status(self, now: datetime) -> NodeStatus:
        states = []
        for name, planned in sorted(self.planned.items()):
            last = self._last_runs.get(PLAN_PREFIX + name)
            states.append(
                PlanState(
                    name=name,
                    version=planned.plan.version,
                    next_run_at=_next_fire(planned.sweep, now) if planned.sweep else None,
                    last_run_at=last[0] if last else None,
                    last_status=last[1] if last else None,
                    skipped=planned.skipped,
                )
            )
        fires = [fire for sweep in self.sweeps() if (fire := _next_fire(sweep, now))]
        return NodeStatus(
            plans=states,
            local_sweeps=len(self.config.sweeps),
            next_run_at=min(fires, default=None),
            swept_now=self._swept_now,
        )

    # --- the schedule ---------------------------------------------------------------------

    def serve(self) -> None:
        """Runs until stopped (SIGTERM or Ctrl-C)."""
        self.schedule()
        log.info(
            "daemon for node %s: %d sweep(s), registry %s, spool %s (pid %d)",
            self.node,
            len(self.config.sweeps),
            self.registry_url,
            self.spool.path,
            os.getpid(),
        )
        if (problem := self.spool.unwritable_reason()) is not None:
            log.error("%s: runs are kept in memory until it can", problem)
        self.scheduler.start()

    def schedule(self) -> None:
        """Makes the scheduler (not started) with every job: the sweeps, deliveries and
        change checks."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.blocking import BlockingScheduler

        # One worker: sweeps, change checks and deliveries never overlap in this process.
        self.scheduler = BlockingScheduler(
            executors={"default": ThreadPoolExecutor(1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
            timezone=UTC,
        )
        for sweep in self.config.sweeps:
            self._schedule_sweep(sweep)
        if self._plans is not None:  # the plans cached: a registry down at start changes nothing
            self.apply_plans(self._plans[1])
        if self.settings.plans:
            self.scheduler.add_job(
                self.poll_plans,
                "interval",
                seconds=self.settings.plan_poll_s,
                jitter=max(1, int(self.settings.plan_poll_s / 10)),
                next_run_time=datetime.now(UTC),  # at start, too
                id="plans",
            )
        # Jitter: a fleet that lost the registry does not come back in the same second.
        self.scheduler.add_job(
            self.flush,
            "interval",
            seconds=self.settings.flush_every_s,
            jitter=max(1, int(self.settings.flush_every_s / 4)),
            id="flush",
        )
        self.scheduler.add_job(
            self.check_changes,
            "interval",
            seconds=self.settings.check_changes_every_s,
            next_run_time=datetime.now(UTC),  # at start, too
        )

    def _schedule_sweep(self, sweep: ScheduledSweep) -> None:
        from apscheduler.triggers.cron import CronTrigger

        trigger = CronTrigger.from_crontab(sweep.cron, timezone=UTC)
        trigger.jitter = int(self.settings.jitter_s) or None
        self.scheduler.add_job(
            self.run_sweep,
            trigger,
            args=[sweep],
            kwargs={"why": "scheduled"},
            id=_SWEEP_JOB + sweep.name,
            replace_existing=True,
        )


def _sweep_of(planned: PlannedSweep | None) -> tuple[object, ...] | None:
    """What a plan's sweep is, to tell whether it changed: its settings and model, or why
    it is skipped (a runner made anew is no change)."""
    if planned is None:
        return None
    if planned.sweep is None:
        return ("skipped", planned.skipped)
    return ("runs", planned.plan.version, planned.sweep.model_dump_json())


def _next_fire(sweep: ScheduledSweep, now: datetime) -> datetime | None:
    """When the sweep's schedule next fires (before its jitter); None: never (30 February)."""
    from apscheduler.triggers.cron import CronTrigger

    fire: datetime | None = CronTrigger.from_crontab(sweep.cron, timezone=UTC).get_next_fire_time(
        None, now
    )
    return fire
