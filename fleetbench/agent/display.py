"""What the CLI prints for people: a run's curve as the batching article shows it, placement,
capacity and regressions answers, the spool, one-line errors; and the consoles it prints
them on.

Every table's columns are no_wrap but its free text's, and it is printed with
fleetbench.cli_answers.print_table: no number is cut at any terminal width."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import typer
from rich.table import Table
from rich.text import Text

from fleetbench.agent.spool import SpooledRun
from fleetbench.cli_answers import console
from fleetbench.contract.answers import (
    BLIND_ABOVE_PCT,
    CapacityAnswer,
    PlacementAnswer,
    RegressionsPublic,
)
from fleetbench.contract.build_label import build_label
from fleetbench.contract.energy import tokens_per_joule
from fleetbench.contract.wire import Point, RunReport, ServingPoint
from fleetbench.printable import printable

__all__ = [
    "SPOOL_UNWRITABLE_EXIT",
    "capacity_table",
    "curve_table",
    "err",
    "error_line",
    "fail",
    "out",
    "placement_table",
    "regressions_table",
    "serving_table",
    "spool_table",
]

out = console()
err = console(stderr=True)

# `sweep --report`, `import` and `flush` when the spool cannot be written (a full disk).
SPOOL_UNWRITABLE_EXIT = 3


def error_line(message: str) -> Text:
    """`error: MESSAGE`, its control characters escaped (a Text is no string the console
    escapes)."""
    return Text.assemble(("error:", "red"), " ", printable(message))


def fail(message: str, code: int = 1) -> typer.Exit:
    """Says what went wrong on stderr, in one line; raise what it returns."""
    err.print(error_line(message), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def curve_table(points: Sequence[Point], *, title: str) -> Table:
    """B, total decode t/s, per-user t/s, ms per token for each user, prefill t/s, and
    tokens per joule where the points' energy was counted."""
    table = Table(title=title, title_justify="left")
    headers = ("PP", "TG", "B", "total decode t/s", "per user t/s", "ms/token/user")
    counted = any(p.energy is not None for p in points)
    for header in (*headers, "prefill t/s", *(["tokens/J"] if counted else [])):
        table.add_column(header, justify="right", no_wrap=True)
    for p in points:
        per_user = p.s_tg / p.b if p.s_tg is not None else None
        ms_per_token = 1000 / per_user if per_user else None
        joules = p.energy.joules if p.energy is not None else None
        table.add_row(
            str(p.pp),
            str(p.tg),
            str(p.b),
            _fmt(p.s_tg),
            _fmt(per_user),
            _fmt(ms_per_token, 0),
            _fmt(p.s_pp),
            *([_fmt(tokens_per_joule(p.b, p.tg, joules))] if counted else []),
        )
    return table


def serving_table(points: Sequence[ServingPoint], *, title: str) -> Table:
    """Per concurrency: requests, total and per-user output t/s, TTFT, ITL, errors."""
    table = Table(title=title, title_justify="left")
    headers = ("C", "completed", "total t/s", "per user p10/p50/p90", "TTFT ms p50/p90/p99")
    for header in (*headers, "ITL ms p50/p99"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("errors", justify="right", overflow="fold")

    def spread(digits: int, *values: float | None) -> str:
        return " / ".join(_fmt(v, digits) for v in values)

    for p in points:
        table.add_row(
            str(p.concurrency),
            f"{p.completed}/{p.requests}",
            _fmt(p.total_tps),
            spread(1, p.per_user_tps_p10, p.per_user_tps_p50, p.per_user_tps_p90),
            spread(0, p.ttft_ms_p50, p.ttft_ms_p90, p.ttft_ms_p99),
            spread(1, p.itl_ms_p50, p.itl_ms_p99),
            ", ".join(f"{n} {kind}" for kind, n in p.errors.items()) or "-",
        )
    return table


def placement_table(answer: PlacementAnswer) -> Table:
    within = f", first token within {answer.max_ttft_ms:g} ms" if answer.max_ttft_ms else ""
    table = Table(
        title=f"{answer.model}: at least {answer.min_tps_per_user:g} tokens/s per user{within} "
        "(speeds in tokens/s; from a serving run, per user is its p10)",
        title_justify="left",
        caption=answer.reason,
        caption_justify="left",
    )
    table.add_column("node", no_wrap=True)
    headers = (
        "B", "per user", "total", "TTFT p90 ms", "prefill", "PP/TG", "KV GiB", "MBU", "$/M tok",
        "tok/J", "build",
    )  # fmt: skip
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("from", no_wrap=True)
    table.add_column("measured", no_wrap=True)
    table.add_column("notes", overflow="fold")
    for c in answer.candidates:
        notes = [
            *(["past the knee"] if c.past_knee else []),
            *(["fit not checked"] if answer.context_tokens and c.fit == "not checked" else []),
            *([c.kv_rules] if c.kv_rules and c.kv_rules.startswith("fit unknown") else []),
            *(["fit predicted only"] if c.fit_basis == "predicted only" else []),
            *(
                [f"its series shows steps of {c.min_detectable_change_pct:.0f}% and more"]
                if (c.min_detectable_change_pct or 0) > BLIND_ABOVE_PCT
                else []
            ),
            *(["measured on the CPU, not the GPU"] if c.engine_on_accelerator is False else []),
        ]
        source = f"{c.server or 'server'} ({c.slots} slots)" if c.slots else c.server
        table.add_row(
            c.node,
            str(c.concurrency),
            _fmt(c.per_user_tps),
            _fmt(c.total_tps),
            _fmt(c.ttft_ms_p90, 0),
            _fmt(c.prefill_tps),
            f"{c.prompt_tokens}/{c.gen_tokens}",
            _fmt(c.kv_cache_gib),
            "-" if c.mbu is None else f"{c.mbu:.0%}",
            _fmt(c.usd_per_million_tokens),
            _fmt(c.tokens_per_joule),
            "-" if c.llama_cpp_build is None else str(c.llama_cpp_build),
            source if c.source == "serving" else "offline curve",
            c.measured_at.strftime("%Y-%m-%d"),
            ", ".join(notes),
        )
    for r in answer.rejected:
        # blank from "per user" to "measured", the reason under "notes"
        table.add_row(r.node, str(r.concurrency), *[""] * 11, f"refused: {r.reason}")
    return table


def capacity_table(answer: CapacityAnswer) -> Table:
    """The plan's nodes, each hardware class alone, the nodes left out; with $/h and $/M
    tokens columns where any is priced (the plan's own in the caption, the reason)."""
    within = f", first token within {answer.max_ttft_ms:g} ms" if answer.max_ttft_ms else ""
    cheapest = ", the cheapest" if answer.minimise == "cost" else ""
    table = Table(
        title=f"{answer.model}: {answer.users} users at {answer.min_tps_per_user:g} tokens/s "
        f"or more each{within}{cheapest}",
        title_justify="left",
        caption=answer.reason,
        caption_justify="left",
    )
    priced = any(n.usd_per_hour is not None for n in answer.plan) or any(
        c.usd_per_hour is not None for c in answer.per_class
    )
    prices = ("$/h", "$/M tok") if priced else ()
    for header in ("node", "hardware"):
        table.add_column(header, no_wrap=True)
    for header in ("users", "per user", "total", *prices, "build", "age (days)"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("from", overflow="fold")  # and why a node was left out
    for n in answer.plan:
        table.add_row(
            n.node,
            n.hardware_class,
            str(n.users),
            _fmt(n.per_user_tps),
            _fmt(n.total_tps),
            # a node's own $/M tokens is placement's; the plan's is in the reason
            *([_fmt(n.usd_per_hour), ""] if priced else []),
            "-" if n.llama_cpp_build is None else str(n.llama_cpp_build),
            f"{n.age_days:.1f}",
            "serving run" if n.source == "serving" else "offline curve",
        )
    for c in answer.per_class:
        needed = "not enough" if c.nodes_needed is None else f"{c.nodes_needed} alone"
        table.add_row(
            f"({needed})", c.hardware_class, str(c.users_served), "", _fmt(c.total_tps),
            *([_fmt(c.usd_per_hour), _fmt(c.usd_per_million_tokens)] if priced else []),
            "", "", f"of {c.nodes_available} nodes",
        )  # fmt: skip
    for r in answer.refused:
        blanks = [""] * (6 + len(prices))  # from "hardware" to "age (days)"
        table.add_row(r.node, *blanks, f"left out: {r.reason}")
    return table


def regressions_table(answer: RegressionsPublic) -> Table:
    """Each lasting step, newest first: the series, before and after, its size against the
    series' noise, and its cause."""
    shown = f"{len(answer.data)} of {answer.count}" if answer.count > len(answer.data) else ""
    table = Table(
        title=f"regressions {shown}".rstrip() if answer.data else "no regression found",
        title_justify="left",
    )
    for header in ("id", "node", "model"):
        table.add_column(header, no_wrap=True)
    for header in ("PP", "TG", "B", "metric", "before", "after", "change %", "noise %"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("first seen", no_wrap=True)
    table.add_column("cause", overflow="fold")
    for r in answer.data:
        digits = 4 if r.metric == "outputs" else 2  # KL divergences in nats, mostly < 0.01
        table.add_row(
            str(r.id), r.node, r.model, str(r.pp), str(r.tg), str(r.b), r.metric,
            _fmt(r.before, digits), _fmt(r.after, digits), f"{r.change_pct:+.1f}",
            f"{r.noise_pct:.1f}",
            r.first_seen_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
            r.cause + (" (acknowledged)" if r.acknowledged_at is not None else ""),
        )  # fmt: skip
    return table


def spool_table(runs: Sequence[SpooledRun]) -> Table:
    """Runs not delivered: queued ones with their next attempt, rejected ones (refused, or
    set aside after repeated failures) with the reason."""
    table = Table(title="runs not delivered", title_justify="left")
    for header in ("run", "state", "attempts", "5xx", "failing since", "next attempt"):
        table.add_column(header, no_wrap=True)
    table.add_column("last error", overflow="fold")
    for r in runs:
        next_attempt = _when(r.next_attempt_at) if r.state == "queued" else "-"
        failing_since = "-" if r.first_failed_at is None else _when(r.first_failed_at)
        table.add_row(
            r.run_id,
            r.state,
            str(r.attempts),
            str(r.server_errors),
            failing_since,
            next_attempt,
            r.last_error or "",
        )
    return table


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


def imported_run_line(line: int, report: RunReport) -> str:
    """Where a table of an imported file starts, what it holds, its settings and build."""
    if report.status == "failed":
        found = f"failed run: {report.error}"
    else:
        bs = [p.b for p in report.points]
        found = f"{len(bs)} rows, B {min(bs)}..{max(bs)}"
    settings = report.settings.model_dump(exclude_none=True)
    said = " ".join(f"{k}={v}" for k, v in settings.items()) or "none printed"
    engine = report.engine
    printed = engine.build_number is not None or engine.commit or engine.backend
    build = build_label(engine) if printed else "none printed"
    return f"line {line}: {found}; settings: {said}; build: {build}"
