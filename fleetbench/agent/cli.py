"""`fleetbench-agent`: report llama-batched-bench results to the registry and query it."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.progress import Progress

from fleetbench.agent.batched_bench_output import BadRow, BatchedBenchOutputError, PassedOver
from fleetbench.agent.cli_options import (
    NodeTokenOption,
    RegistryOption,
    command_settings,
    int_list,
)
from fleetbench.agent.cli_questions import (
    COMPARE_HELP,
    QUESTION_HELP,
    capacity,
    compare,
    placement,
    regressions,
)
from fleetbench.agent.cli_serving import serve_sweep_command
from fleetbench.agent.config import open_spool
from fleetbench.agent.contention import (
    ContentionThresholds,
    busy_now,
    contended_warning,
    judged_report,
)
from fleetbench.agent.display import (
    SPOOL_UNWRITABLE_EXIT,
    curve_table,
    err,
    error_line,
    fail,
    imported_run_line,
    out,
    spool_table,
)
from fleetbench.agent.errors import (
    EngineUnavailable,
    SpoolError,
    SpoolUnwritable,
    validation_problems,
)
from fleetbench.agent.fingerprint import take_fingerprint
from fleetbench.agent.gguf_model import ModelFileError, describe_gguf
from fleetbench.agent.handover import (
    hand_over,
    import_through_the_spool,
    registry_client,
    spool_run,
)
from fleetbench.agent.importer import reports_from_output
from fleetbench.agent.runners import LLAMA_CPP_NAMES, SweepSpec
from fleetbench.agent.runners.engines import UnknownEngine, runner_for
from fleetbench.agent.runners.repeats import MIN_AUTO_REPEATS
from fleetbench.agent.sweep import energy_line, measure_run, memory_line, sweep_lock
from fleetbench.cli_answers import print_table, version_option
from fleetbench.cli_usage import help_of, options_of, validated
from fleetbench.contract.accelerator import run_off_accelerator
from fleetbench.contract.wire import FailedPoint, ModelInfo, Point
from fleetbench.printable import EscapingFormatter

_AUTO = SweepSpec.model_construct()  # the defaults of repeats = "auto", for the help

# rich_markup_mode=None: the helps' "[default: ...]" shown as written, not read as markup
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def _log_to_stderr(level: int, line: str, *, force: bool = False) -> None:
    """Logs to stderr in `line`'s format, each record on one line whatever its message
    holds (a plan's name, a registry's error: fleetbench.printable); unless `force`, only
    where logging is not set up yet (a test's own handlers are kept)."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter(line))
    logging.basicConfig(level=level, handlers=[handler], force=force)


@app.callback()
def _every_command(
    _version: Annotated[bool, version_option("fleetbench-agent")] = False,
) -> None:
    # What a command logs (the registry left fields of a run out) is shown as Python's own
    # last-resort handler shows it, but escaped.
    _log_to_stderr(logging.WARNING, "%(message)s")


@app.command("import")
def import_output(
    file: Annotated[Path, typer.Argument(help="llama-batched-bench output, a log or a report")],
    node: Annotated[str, typer.Option(help="the node that measured it")],
    model: Annotated[str, typer.Option(help="the model's display name")],
    model_file: Annotated[
        Path | None, typer.Option(help="the GGUF file: adds its sha256 and architecture")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help='the device it was measured on, e.g. "Apple M4 Pro" or "NVIDIA H100 80GB '
            'HBM3": its hardware class and memory bandwidth (docs/design/bandwidth.md)',
        ),
    ] = None,
    registry: RegistryOption = None,
    token: NodeTokenOption = None,
    measured_at: Annotated[
        datetime | None,
        typer.Option(help="when it was measured (ISO 8601; default: the file's mtime)"),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="say where each table starts, its settings and build, and which other "
            "tables were passed over and why; print the reports as JSON; send nothing",
        ),
    ] = False,
) -> None:
    """Read llama-batched-bench tables (or --output-format jsonl) and report each as a run."""
    settings = command_settings()
    skipped: list[BadRow] = []  # tables left out for a row that is no valid measurement
    passed_over: list[PassedOver] = []  # other tools' tables
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
        info = describe_gguf(model_file, name=model) if model_file else ModelInfo(name=model)
        when = measured_at or datetime.fromtimestamp(file.stat().st_mtime, UTC)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        reports = reports_from_output(
            text,
            node=node,
            model=info,
            measured_at=when,
            device=device,
            skipped=skipped,
            passed_over=passed_over,
        )
    except (OSError, ModelFileError) as exc:
        raise fail(str(exc)) from exc
    except BatchedBenchOutputError as exc:
        raise fail(f"{file}: {exc}") from exc
    except ValidationError as exc:  # --node, --model or --device that no report may carry
        raise fail(validation_problems(exc)) from exc

    for problem in skipped:
        err.print(
            f"error: {file}: {problem}; that table is left out",
            highlight=False,
        )
    for line, _, left_out in reports:
        if left_out:
            names = ", ".join(repr(name) for name in left_out)
            err.print(
                f"warning: {file}: line {line}: column(s) {names} read past: "
                "not llama-batched-bench's",
                highlight=False,
            )
    if dry_run:
        for line, report, _ in reports:
            err.print(f"{file}: {imported_run_line(line, report)}", highlight=False)
        for other in passed_over:
            err.print(f"{file}: {other}: passed over", highlight=False)
        out.print_json(json.dumps([r.report.model_dump(mode="json") for r in reports]))
        if skipped:
            raise typer.Exit(1)
        return
    secret = token or settings.current_token()
    if not secret:
        raise fail(
            "no registry token: pass --token or set FLEETBENCH_TOKEN "
            "(create one with `fleetbench-registry token create --node NAME`)",
            code=2,
        )
    url = registry or settings.registry_url
    for number, (line, report, _) in enumerate(reports, start=1):
        build = report.engine.build_number
        if report.status == "failed":
            err.print(
                f"run {number}/{len(reports)} (line {line}): failed: {report.error}",
                highlight=False,
            )
            continue
        title = f"run {number}/{len(reports)} (line {line}): {model} on {node}"
        if build is not None:
            title += f", llama.cpp build {build}"
        print_table(err, curve_table(report.points, title=title))
    import_through_the_spool([r.report for r in reports], settings, url, secret)
    if skipped:
        raise typer.Exit(1)


# The option that sets each of SweepSpec's fields (llama.cpp's names where they differ).
SWEEP_OPTIONS = options_of(SweepSpec, {field: flag for flag, field in LLAMA_CPP_NAMES.items()})


@app.command()
def sweep(
    model: Annotated[Path, typer.Option("--model", "-m", help="the GGUF file to measure")],
    npp: Annotated[
        str | None, typer.Option(help=help_of(SweepSpec, "npp", "prompt lengths PP, comma list"))
    ] = None,
    ntg: Annotated[
        str | None, typer.Option(help=help_of(SweepSpec, "ntg", "generated tokens TG, comma list"))
    ] = None,
    npl: Annotated[
        str | None, typer.Option(help=help_of(SweepSpec, "npl", "concurrencies B, comma list"))
    ] = None,
    ctx_size: Annotated[
        int | None, typer.Option("--ctx-size", "-c", help="KV cells [default: sized to fit]")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", "-b", help=help_of(SweepSpec, "n_batch", ""))
    ] = None,
    ubatch_size: Annotated[
        int | None, typer.Option("--ubatch-size", "-ub", help=help_of(SweepSpec, "n_ubatch", ""))
    ] = None,
    flash_attn: Annotated[
        str | None, typer.Option(help=help_of(SweepSpec, "flash_attn", "on, off or auto"))
    ] = None,
    kv_unified: Annotated[bool, typer.Option("--kv-unified", help="one KV buffer for all")] = False,
    pp_shared: Annotated[bool, typer.Option("--pp-shared", help="one prompt for all")] = False,
    n_gpu_layers: Annotated[
        int | None,
        typer.Option("--n-gpu-layers", "-ngl", help=help_of(SweepSpec, "n_gpu_layers", "-1: all")),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", "-t", help="[default: the physical cores]")
    ] = None,
    cache_type_k: Annotated[
        str | None,
        typer.Option("--cache-type-k", "-ctk", help=help_of(SweepSpec, "cache_type_k", "")),
    ] = None,
    cache_type_v: Annotated[
        str | None,
        typer.Option("--cache-type-v", "-ctv", help=help_of(SweepSpec, "cache_type_v", "")),
    ] = None,
    repeats: Annotated[
        str | None,
        typer.Option(
            help=help_of(
                SweepSpec,
                "repeats",
                "measure each point N times, or auto: until the standard error of its S_TG "
                f"is under {_AUTO.repeat_target:.1%} ({MIN_AUTO_REPEATS} to {_AUTO.max_repeats} "
                f"times, no new round after {_AUTO.repeat_budget_s / 60:g} minutes)",
            )
        ),
    ] = None,
    no_outputs: Annotated[
        bool,
        typer.Option(
            "--no-outputs",
            help="skip the model's output fingerprint on the reference text (a few seconds, "
            "after the points)",
        ),
    ] = False,
    engine: Annotated[
        str | None,
        typer.Option(help="llama-cpp-python or llama-batched-bench [default: as --binary says]"),
    ] = None,
    binary: Annotated[
        Path | None,
        typer.Option(help="run this llama-batched-bench instead of llama.cpp in-process"),
    ] = None,
    model_name: Annotated[
        str | None, typer.Option(help="display name [default: the file name]")
    ] = None,
    node: Annotated[
        str | None, typer.Option(help="[env: FLEETBENCH_NODE; default: hostname]")
    ] = None,
    report: Annotated[
        bool, typer.Option("--report", help="spool the run and deliver it to the registry")
    ] = False,
    registry: RegistryOption = None,
    token: NodeTokenOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the run report as JSON")] = False,
) -> None:
    """Measure the batching curve of a model on this machine (llama.cpp in-process, or the
    node's llama-batched-bench with --binary)."""
    if repeats is not None and repeats != "auto" and not repeats.strip().isdigit():
        raise typer.BadParameter(
            f"{repeats!r}: give a number of times, or auto", param_hint="--repeats"
        )
    given = {  # only what was given: the defaults are SweepSpec's, written there once
        "npp": None if npp is None else int_list(npp, "--npp"),
        "ntg": None if ntg is None else int_list(ntg, "--ntg"),
        "npl": None if npl is None else int_list(npl, "--npl", least=1),
        "ctx_size": ctx_size,
        "batch_size": batch_size,
        "ubatch_size": ubatch_size,
        "flash_attn": flash_attn,
        "kv_unified": kv_unified or None,
        "pp_shared": pp_shared or None,
        "n_gpu_layers": n_gpu_layers,
        "threads": threads,
        "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "repeats": repeats,
        "outputs": False if no_outputs else None,
    }
    spec = validated(SweepSpec, given, SWEEP_OPTIONS, otherwise="--npp, --ntg or --npl")
    try:
        runner = runner_for(engine, binary)
    except UnknownEngine as exc:
        raise typer.BadParameter(str(exc), param_hint="--engine") from None
    except EngineUnavailable as exc:
        raise fail(str(exc), code=2) from None
    settings = command_settings(token)
    name = model_name or model.name.removesuffix(".gguf")
    lock = settings.spool.with_name("sweep.lock")
    try:  # made here, so that a disk too full for it is one line, not a traceback
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch(exist_ok=True)
    except OSError as exc:
        raise fail(f"cannot make the sweep lock {lock}: {exc}") from exc
    thresholds = ContentionThresholds.of(settings)
    if (busy := busy_now(thresholds)) is not None:
        err.print(f"warning: {busy}", highlight=False, soft_wrap=True)
    with (
        sweep_lock(lock) as acquired,
        # drawn when a point is done, never by a refresh thread waking while the engine
        # measures on the same cores
        Progress(console=err, transient=True, auto_refresh=False) as progress,
    ):
        if not acquired:
            raise fail("another sweep is running on this machine; try again later")
        task = progress.add_task(f"sweeping {name}", total=len(spec.grid()))

        def show(result: Point | FailedPoint) -> None:
            progress.advance(task)
            progress.refresh()
            if isinstance(result, FailedPoint):
                progress.console.print(f"B={result.b} PP={result.pp}: {result.reason}")

        run = measure_run(
            model,
            spec,
            runner,
            node=node or settings.node,
            name=name,
            sha256_cache=settings.cache_dir / "sha256.json",
            on_point=show,
        )
    run = judged_report(run, thresholds)
    if (why := run_off_accelerator(run)) is not None:
        err.print(f"warning: {why}", highlight=False, soft_wrap=True)
    for line in (memory_line(run), energy_line(run)):
        if line is not None:
            err.print(line, highlight=False, soft_wrap=True)
    spooled = spool_run(run, settings) if report else None
    unspooled = isinstance(spooled, SpoolError)  # then stdout keeps the run as JSON
    if as_json or unspooled:
        out.print_json(run.model_dump_json())
    if not as_json:
        table = curve_table(run.points, title=f"{name} on {run.node} ({run.status})")
        print_table(err if unspooled else out, table)
    if run.error is not None:
        err.print(error_line(run.error), highlight=False, soft_wrap=True)
    if (contended := contended_warning(run.contention)) is not None:
        err.print(f"warning: {contended}", highlight=False, soft_wrap=True)
    if spooled is not None:
        hand_over(run, spooled, settings, registry)
    if run.status == "failed":
        raise typer.Exit(1)


@app.command()
def daemon(
    config: Annotated[Path, typer.Option("--config", help="agent.toml: [agent] and [[sweep]]")],
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the configured sweeps on their schedules and deliver every run, until stopped."""
    from fleetbench.agent.daemon import ConfigError, Daemon, load_config

    _log_to_stderr(
        logging.DEBUG if verbose else logging.INFO,
        "%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,  # in place of every command's
    )
    try:
        loaded = load_config(config)
    except ConfigError as exc:
        raise fail(str(exc), code=2) from exc
    try:
        running = Daemon(loaded)
    except SpoolError as exc:
        raise fail(str(exc)) from exc
    running.serve()


@app.command()
def fingerprint(
    probe: Annotated[
        list[str] | None,
        typer.Option(help="run only these probes (repeatable): host, nvidia, apple"),
    ] = None,
) -> None:
    """Print this machine's hardware fingerprint as JSON: its hash and what the probes saw."""
    out.print_json(take_fingerprint(probe).model_dump_json())


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """Runs in the local spool: queued for delivery, delivered, and rejected (with why).
    Reads a spool on a full disk too, and says the disk is full."""
    try:
        spool = open_spool(command_settings())
        runs = spool.runs()
        counts = spool.counts()
    except SpoolError as exc:
        raise fail(str(exc)) from exc
    problem = spool.unwritable_reason()
    if as_json:
        out.print_json(json.dumps([dataclasses.asdict(r) for r in runs]))
        if problem is not None:
            err.print(f"warning: {problem}", highlight=False, soft_wrap=True)
        return
    out.print(
        f"spool {spool.path}: {counts['queued']} queued, {counts['delivered']} delivered, "
        f"{counts['rejected']} rejected",
        soft_wrap=True,
    )
    if problem is not None:
        out.print(f"warning: {problem}", highlight=False, soft_wrap=True)
    waiting = [r for r in runs if r.state != "delivered"]
    if waiting:
        print_table(out, spool_table(waiting))


@app.command()
def flush(registry: RegistryOption = None, token: NodeTokenOption = None) -> None:
    """Deliver every queued run now, whatever its backoff, and say what is left. Exit 0 when
    nothing waits (all delivered or rejected), 1 when some runs still wait, 3 when the
    spool cannot be written."""
    settings = command_settings(token)
    try:
        spool = open_spool(settings)
        queued = spool.counts()["queued"]
    except SpoolError as exc:
        raise fail(str(exc)) from exc
    with (
        registry_client(registry or settings.registry_url, settings.current_token()) as client,
        Progress(console=err, transient=True) as progress,
    ):
        task = progress.add_task(f"delivering {queued} run(s)", total=queued)
        try:
            result = spool.flush(client, every_queued=True, progress=lambda: progress.advance(task))
        except SpoolUnwritable as exc:
            raise fail(str(exc), code=SPOOL_UNWRITABLE_EXIT) from exc
    waiting = f": {result.waiting_reason}" if result.deferred else ""
    out.print(
        f"{result.delivered} delivered, {result.rejected} rejected, "
        f"{result.deferred} still waiting{waiting}",
        highlight=False,
        soft_wrap=True,
    )
    if result.deferred:
        raise typer.Exit(1)


app.command("serve-sweep")(serve_sweep_command)
app.command(epilog=QUESTION_HELP)(placement)
app.command(epilog=QUESTION_HELP)(capacity)
app.command(epilog=COMPARE_HELP)(compare)
app.command(epilog=QUESTION_HELP)(regressions)

if __name__ == "__main__":
    app()
