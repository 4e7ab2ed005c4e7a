"""What bench/load.py's reports cost: CPU seconds of the registry's processes, PostgreSQL's
and the generator's; the registry's own account of each ingest and judge step
(`fleetbench_*_step_*` in /metrics: CPU, statements, rows); and, where PostgreSQL loads
pg_stat_statements, the statements that cost it most. Each is sampled before and after the
load and divided by the reports accepted."""

from __future__ import annotations

import resource
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import psutil
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench.common import libpq_url

__all__ = ["CostSample", "StatementCosts", "print_costs", "sample_costs", "step_costs"]

_STEP_FAMILIES = {
    "fleetbench_ingest_step_cpu_seconds": "cpu_s",
    "fleetbench_ingest_step_statements": "statements",
    "fleetbench_ingest_step_rows": "rows",
    "fleetbench_judge_step_cpu_seconds": "cpu_s",
    "fleetbench_judge_step_statements": "statements",
    "fleetbench_judge_step_rows": "rows",
}


@dataclass
class CostSample:
    """CPU seconds by process (registry's, PostgreSQL's, the generator's own) and the
    registry's step counters ((work, step) -> figure -> value) at one moment."""

    registry: dict[int, float]
    postgresql: dict[int, float]
    generator: float
    steps: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)


def _cpu(processes: Sequence[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def _registry_processes(root: int) -> list[psutil.Process]:
    parent = psutil.Process(root)
    return [parent, *parent.children(recursive=True)]


def _postgres_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "") == "postgres"]


def _steps(base_url: str) -> dict[tuple[str, str], dict[str, float]]:
    """The registry's step counters, summed over its workers (its /metrics does that)."""
    found: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    body = httpx.get(f"{base_url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(body):
        figure = _STEP_FAMILIES.get(family.name)
        if figure is None:
            continue
        work = family.name.split("_")[1]  # ingest or judge
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = (work, sample.labels["step"])
                found[key][figure] = found[key].get(figure, 0.0) + sample.value
    return dict(found)


def sample_costs(registry_pid: int, base_url: str, *, postgres: bool) -> CostSample:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return CostSample(
        registry=_cpu(_registry_processes(registry_pid)),
        postgresql=_cpu(_postgres_processes()) if postgres else {},
        generator=own.ru_utime + own.ru_stime,
        steps=_steps(base_url),
    )


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two samples, counting processes started in between from 0
    (PostgreSQL starts a backend per connection); one that exited in between is not
    counted, so the registry's pool keeps its connections for the whole load."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


class StatementCosts:
    """pg_stat_statements of one database, when the server loads it: reset before the
    load, read after."""

    def __init__(self, url: str) -> None:
        self.url = libpq_url(url)
        self.error: str | None = None
        try:
            with psycopg.connect(self.url, autocommit=True) as connection:
                connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                connection.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error as exc:
            self.error = str(exc).strip().splitlines()[0]

    def top(self, limit: int = 12) -> list[tuple[int, int, float, str]]:
        """(calls, rows, milliseconds, statement) of the database's costliest statements."""
        if self.error is not None:
            return []
        with psycopg.connect(self.url, autocommit=True) as connection:
            rows = connection.execute(
                "SELECT calls, rows, total_exec_time + total_plan_time, query "
                "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = current_database() ORDER BY 3 DESC LIMIT %s",
                (limit,),
            ).fetchall()
        return [(int(c), int(r), float(ms), " ".join(q.split())) for c, r, ms, q in rows]


def print_costs(
    before: CostSample,
    after: CostSample,
    *,
    reports: int,
    seconds: float,
    statements: StatementCosts | None,
) -> dict[str, float]:
    """Prints what the reports cost; returns CPU milliseconds per report by process."""
    per = max(reports, 1)
    cpu = {
        "registry": _used(before.registry, after.registry),
        "postgresql": _used(before.postgresql, after.postgresql),
        "load generator": after.generator - before.generator,
    }
    print(f"  CPU per accepted report ({reports} reports, {seconds:.0f} s of CPU samples):")
    for name, used in cpu.items():
        print(
            f"    {name:<15} {used * 1000 / per:7.3f} ms   ({used:.1f} s, "
            f"{used / seconds:.2f} cores)"
        )
    _print_steps(before, after, per)
    if statements is not None:
        _print_statements(statements, per)
    return {name: used * 1000 / per for name, used in cpu.items()}


def step_costs(
    before: CostSample, after: CostSample, *, reports: int
) -> dict[str, dict[str, dict[str, float]]]:
    """The registry's own account per accepted report: work (ingest, judge) -> step -> CPU
    milliseconds, statements and rows, as print_costs prints them."""
    per = max(reports, 1)
    found: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (work, step), figures in after.steps.items():
        earlier = before.steps.get((work, step), {})
        used = {name: value - earlier.get(name, 0.0) for name, value in figures.items()}
        found[work][step] = {
            "cpu_ms": used.get("cpu_s", 0.0) * 1000 / per,
            "statements": used.get("statements", 0.0) / per,
            "rows": used.get("rows", 0.0) / per,
        }
    return dict(found)


def _print_steps(before: CostSample, after: CostSample, per: int) -> None:
    works = step_costs(before, after, reports=per)
    if not works:
        print("  (the registry's /metrics has no step costs)")
        return
    for work, steps in sorted(works.items()):
        total = sum(f["cpu_ms"] for f in steps.values())
        statements = sum(f["statements"] for f in steps.values())
        print(
            f"  {work} steps, per report: {total:.3f} ms CPU in the "
            f"{'writer' if work == 'ingest' else 'judge'} threads, "
            f"{statements:.2f} statements"
        )
        for step, figures in steps.items():
            print(
                f"    {step:<14} {figures['cpu_ms']:7.3f} ms  "
                f"{figures['statements']:6.2f} statements  "
                f"{figures['rows']:7.2f} rows"
            )


def _print_statements(statements: StatementCosts, per: int) -> None:
    if statements.error is not None:
        print(f"  pg_stat_statements: not available ({statements.error})")
        return
    print("  PostgreSQL's costliest statements (pg_stat_statements), per report:")
    print("      calls     rows  ms spent  statement")
    for calls, rows, ms, query in statements.top():
        print(f"    {calls / per:7.2f} {rows / per:8.2f} {ms / per:8.3f}  {query[:90]}")
