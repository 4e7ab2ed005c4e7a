"""`fleetbench-agent`: report llama-batched-bench results to the registry and query it."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import Progress

from fleetbench.agent.batched_bench_output import BadRow, BatchedBenchOutputError
from fleetbench.agent.client import RegistryClient
from fleetbench.agent.config import AgentSettings, SettingsError, load_settings
from fleetbench.agent.display import console, curve_table, placement_table, spool_table
from fleetbench.agent.errors import ClientError, EngineUnavailable, SpoolError, SpoolUnwritable
from fleetbench.agent.fingerprint import take_fingerprint
from fleetbench.agent.gguf_model import ModelFileError, describe_gguf
from fleetbench.agent.importer import reports_from_output
from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.engines import UnknownEngine, runner_for
from fleetbench.agent.spool import Spool, open_spool
from fleetbench.agent.sweep import measure_run
from fleetbench.contract.wire import FailedPoint, ModelInfo, Point, RunReport

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
out = console()
err = console(stderr=True)

RegistryOption = Annotated[
    str | None,
    typer.Option("--registry", help="registry URL [env: FLEETBENCH_REGISTRY_URL]"),
]


def _field_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


# `sweep --report` and `flush` when the spool cannot be written (a full disk).
SPOOL_UNWRITABLE_EXIT = 3


def _settings() -> AgentSettings:
    """FLEETBENCH_* settings; a bad value is a one-line error naming the variable."""
    try:
        return load_settings()
    except SettingsError as exc:
        raise _fail(str(exc), code=2) from exc


def _token(settings: AgentSettings) -> str | None:
    return settings.token.get_secret_value() if settings.token else None


@app.command("import")
def import_output(
    file: Annotated[Path, typer.Argument(help="llama-batched-bench output, a log or a report")],
    node: Annotated[str, typer.Option(help="the node that measured it")],
    model: Annotated[str, typer.Option(help="the model's display name")],
    model_file: Annotated[
        Path | None, typer.Option(help="the GGUF file: adds its sha256 and architecture")
    ] = None,
    registry: RegistryOption = None,
    token: Annotated[
        str | None, typer.Option(help="the node's token [env: FLEETBENCH_TOKEN]")
    ] = None,
    measured_at: Annotated[
        datetime | None,
        typer.Option(help="when it was measured (ISO 8601; default: the file's mtime)"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the reports as JSON, send nothing")
    ] = False,
) -> None:
    """Read llama-batched-bench tables (or --output-format jsonl) and report each as a run."""
    settings = _settings()
    skipped: list[BadRow] = []  # tables left out for a row that is no valid measurement
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
        info = describe_gguf(model_file, name=model) if model_file else ModelInfo(name=model)
        when = measured_at or datetime.fromtimestamp(file.stat().st_mtime, UTC)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        reports = reports_from_output(
            text, node=node, model=info, measured_at=when, skipped=skipped
        )
    except (OSError, ModelFileError) as exc:
        raise _fail(str(exc)) from exc
    except BatchedBenchOutputError as exc:
        raise _fail(f"{file}: {exc}") from exc
    except ValidationError as exc:  # --node or --model that no report may carry
        raise _fail(_field_errors(exc)) from exc

    for problem in skipped:
        err.print(
            f"error: {escape(str(file))}: {escape(str(problem))}; that table is left out",
            highlight=False,
        )
    if dry_run:
        out.print_json(json.dumps([r.report.model_dump(mode="json") for r in reports]))
        if skipped:
            raise typer.Exit(1)
        return
    secret = token or _token(settings)
    if not secret:
        raise _fail(
            "no registry token: pass --token or set FLEETBENCH_TOKEN "
            "(create one with `fleetbench-registry token create --node NAME`)",
            code=2,
        )
    url = registry or settings.registry_url
    for number, (line, report) in enumerate(reports, start=1):
        build = report.engine.build_number
        err.print(
            curve_table(
                report.points,
                title=f"run {number}/{len(reports)} (line {line}): {model} on {node}"
                + (f", llama.cpp build {build}" if build is not None else ""),
            )
        )
    _import_through_the_spool([r for _, r in reports], settings, url, secret)
    if skipped:
        raise typer.Exit(1)


def _import_through_the_spool(
    reports: list[RunReport], settings: AgentSettings, url: str, token: str
) -> None:
    """Spools the imported runs and delivers them (these alone, with this token): what the
    registry cannot take now stays queued, never lost. Importing again asks the registry
    again, whatever the spool made of the runs before."""
    try:
        spool = open_spool(settings)
        for added, report in enumerate(reports):
            try:
                spool.add(report, again=True)
            except SpoolError as exc:
                before = f"; {added} of {len(reports)} run(s) spooled before it" if added else ""
                raise _fail(
                    f"{exc}{before}; nothing else was sent", code=SPOOL_UNWRITABLE_EXIT
                ) from exc
            except ValueError as exc:  # delivered before with another measurement time
                raise _fail(f"{exc}: {_IMPORTED_BEFORE}") from exc
        ids = {str(r.run_id) for r in reports}
        with RegistryClient(url, token=token) as client:
            result = spool.flush(client, every_queued=True, only=ids)
        states = {r.run_id: r for r in spool.runs() if r.run_id in ids}
    except SpoolError as exc:  # unreadable, or the disk filled meanwhile
        raise _fail(
            f"{exc}; import again once the spool can be written", code=SPOOL_UNWRITABLE_EXIT
        ) from exc
    failed = False
    for report in reports:
        run_id = str(report.run_id)
        receipt, state = result.receipts.get(run_id), states.get(run_id)
        if receipt is not None:
            out.print(
                f"{receipt.outcome}: run {run_id} ({receipt.points} points) at {url}",
                soft_wrap=True,
            )
            continue
        failed = True
        why = (state.last_error if state else None) or "not tried"
        if why.startswith("registry answered 409"):
            why = f"{why}: {_IMPORTED_BEFORE}"
        elif why.startswith("registry answered 401"):
            why = f"{why}; give the node's token and import again"
        elif state is not None and state.state == "queued":
            why = (
                f"{why}; it is queued in {spool.path}: import again when the registry answers, "
                "or `fleetbench-agent flush` with that node's token"
            )
        err.print(f"error: run {run_id} not stored: {escape(why)}", highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


_IMPORTED_BEFORE = (
    "it was imported before with another measurement time; pass --measured-at with the "
    "time it was imported with"
)


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(
            f"{text!r} is not a comma list of integers", param_hint=option
        ) from exc
    if not values or any(v < 0 for v in values) or (option == "--npl" and 0 in values):
        raise typer.BadParameter(
            f"{text!r}: give non-negative integers (B >= 1)", param_hint=option
        )
    return values


@app.command()
def sweep(
    model: Annotated[Path, typer.Option("--model", "-m", help="the GGUF file to measure")],
    npp: Annotated[str, typer.Option(help="prompt lengths PP, comma list")] = "128",
    ntg: Annotated[str, typer.Option(help="generated tokens TG, comma list")] = "128",
    npl: Annotated[str, typer.Option(help="concurrencies B, comma list")] = "1,2,4,8",
    ctx_size: Annotated[
        int | None, typer.Option("--ctx-size", "-c", help="KV cells [default: sized to fit]")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b")] = 2048,
    ubatch_size: Annotated[int, typer.Option("--ubatch-size", "-ub")] = 512,
    flash_attn: Annotated[str, typer.Option(help="on, off or auto")] = "auto",
    kv_unified: Annotated[bool, typer.Option("--kv-unified", help="one KV buffer for all")] = False,
    pp_shared: Annotated[bool, typer.Option("--pp-shared", help="one prompt for all")] = False,
    n_gpu_layers: Annotated[int, typer.Option("--n-gpu-layers", "-ngl")] = -1,
    threads: Annotated[int | None, typer.Option("--threads", "-t")] = None,
    cache_type_k: Annotated[str, typer.Option("--cache-type-k", "-ctk")] = "f16",
    cache_type_v: Annotated[str, typer.Option("--cache-type-v", "-ctv")] = "f16",
    repeats: Annotated[int, typer.Option(min=1, help="measure each point N times")] = 1,
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
    as_json: Annotated[bool, typer.Option("--json", help="print the run report as JSON")] = False,
) -> None:
    """Measure the batching curve of a model on this machine (llama.cpp in-process, or the
    node's llama-batched-bench with --binary)."""
    try:
        spec = SweepSpec.model_validate(
            {
                "npp": _ints(npp, "--npp"),
                "ntg": _ints(ntg, "--ntg"),
                "npl": _ints(npl, "--npl"),
                "ctx_size": ctx_size,
                "batch_size": batch_size,
                "ubatch_size": ubatch_size,
                "flash_attn": flash_attn,
                "kv_unified": kv_unified,
                "pp_shared": pp_shared,
                "n_gpu_layers": n_gpu_layers,
                "threads": threads,
                "cache_type_k": cache_type_k,
                "cache_type_v": cache_type_v,
                "repeats": repeats,
            }
        )
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        flag = "--" + str(problem["loc"][0]).replace("_", "-")
        raise typer.BadParameter(problem["msg"], param_hint=flag) from None
    try:
        runner = runner_for(engine, binary)
    except UnknownEngine as exc:
        raise typer.BadParameter(str(exc), param_hint="--engine") from None
    except EngineUnavailable as exc:
        raise _fail(str(exc), code=2) from None
    from fleetbench.agent.daemon import sweep_lock

    settings = _settings()
    name = model_name or model.name.removesuffix(".gguf")
    lock = settings.spool.with_name("sweep.lock")
    try:  # made here, so that a disk too full for it is one line, not a traceback
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch(exist_ok=True)
    except OSError as exc:
        raise _fail(f"cannot make the sweep lock {lock}: {exc}") from exc
    with (
        sweep_lock(lock) as acquired,
        Progress(console=err, transient=True) as progress,
    ):
        if not acquired:
            raise _fail("another sweep is running on this machine; try again later")
        task = progress.add_task(f"sweeping {name}", total=len(spec.grid()))

        def show(result: Point | FailedPoint) -> None:
            progress.advance(task)
            if isinstance(result, FailedPoint):
                progress.console.print(f"B={result.b} PP={result.pp}: {escape(result.reason)}")

        run = measure_run(
            model,
            spec,
            runner,
            node=node or settings.node,
            name=name,
            sha256_cache=settings.cache_dir / "sha256.json",
            on_point=show,
        )
    spooled = _spooled(run, settings) if report else None
    unspooled = isinstance(spooled, SpoolUnwritable)  # then stdout keeps the run as JSON
    if as_json or unspooled:
        out.print_json(run.model_dump_json())
    if not as_json:
        table = curve_table(run.points, title=f"{name} on {run.node} ({run.status})")
        (err if unspooled else out).print(table)
    if run.error is not None:
        err.print(f"[red]error:[/red] {escape(run.error)}", highlight=False, soft_wrap=True)
    if isinstance(spooled, SpoolUnwritable):
        _deliver_unspooled(run, spooled, settings, registry)
    elif spooled is not None:
        _deliver(run, spooled, settings, registry)
    if run.status == "failed":
        raise typer.Exit(1)


def _spooled(run: RunReport, settings: AgentSettings) -> Spool | SpoolUnwritable:
    """The spool holding the run, or why it cannot take it."""
    spool = open_spool(settings)
    try:
        spool.add(run)
    except SpoolUnwritable as exc:
        return exc
    return spool


def _deliver(run: RunReport, spool: Spool, settings: AgentSettings, registry: str | None) -> None:
    with RegistryClient(registry or settings.registry_url, token=_token(settings)) as client:
        try:
            result = spool.flush(client)
        except SpoolUnwritable as exc:
            raise _fail(
                f"{exc}; run {run.run_id} is spooled and will be delivered later",
                code=SPOOL_UNWRITABLE_EXIT,
            ) from exc
    state = {r.run_id: r for r in spool.runs()}[str(run.run_id)]
    if state.state == "delivered":
        err.print(f"run {run.run_id} delivered to the registry", soft_wrap=True)
    else:
        err.print(
            f"run {run.run_id} {state.state} in the spool ({spool.path}): {state.last_error}",
            soft_wrap=True,
        )
    if result.rejected:
        raise typer.Exit(1)


def _deliver_unspooled(
    run: RunReport, problem: SpoolUnwritable, settings: AgentSettings, registry: str | None
) -> None:
    """The spool cannot take the run (it is on stdout as JSON by now): hand it to the
    registry directly, once. Delivered, that is said and the command goes on (exit 0, or 1
    for a failed run); not delivered, one line says why and the command exits 3, so nothing
    is lost silently: `sweep --report > run.json` keeps the run."""
    url = registry or settings.registry_url
    try:
        with RegistryClient(url, token=_token(settings)) as client:
            client.submit_run(run)
    except ClientError as exc:
        raise _fail(
            f"{problem}, and the registry did not take the run directly ({exc}); "
            "the run is printed on stdout as JSON",
            code=SPOOL_UNWRITABLE_EXIT,
        ) from exc
    err.print(
        f"warning: {problem}; run {run.run_id} was delivered to {url} directly",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def daemon(
    config: Annotated[Path, typer.Option("--config", help="agent.toml: [agent] and [[sweep]]")],
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the configured sweeps on their schedules and deliver every run, until stopped."""
    import logging

    from fleetbench.agent.daemon import ConfigError, Daemon, load_config

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        loaded = load_config(config)
    except ConfigError as exc:
        raise _fail(str(exc), code=2) from exc
    try:
        running = Daemon(loaded)
    except SpoolError as exc:
        raise _fail(str(exc)) from exc
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
    spool = open_spool(_settings())
    try:
        runs = spool.runs()
        counts = spool.counts()
    except SpoolError as exc:
        raise _fail(str(exc)) from exc
    problem = spool.unwritable_reason()
    if as_json:
        out.print_json(json.dumps([dataclasses.asdict(r) for r in runs]))
        if problem is not None:
            err.print(f"warning: {escape(problem)}", highlight=False, soft_wrap=True)
        return
    out.print(
        f"spool {spool.path}: {counts['queued']} queued, {counts['delivered']} delivered, "
        f"{counts['rejected']} rejected",
        soft_wrap=True,
    )
    if problem is not None:
        out.print(f"warning: {escape(problem)}", highlight=False, soft_wrap=True)
    waiting = [r for r in runs if r.state != "delivered"]
    if waiting:
        out.print(spool_table(waiting))


@app.command()
def flush(registry: RegistryOption = None) -> None:
    """Deliver every queued run now, whatever its backoff, and say what is left. Exit 0 when
    nothing waits (all delivered or rejected), 1 when some runs still wait, 3 when the
    spool cannot be written."""
    settings = _settings()
    spool = open_spool(settings)
    try:
        queued = spool.counts()["queued"]
    except SpoolError as exc:
        raise _fail(str(exc)) from exc
    with (
        RegistryClient(registry or settings.registry_url, token=_token(settings)) as client,
        Progress(console=err, transient=True) as progress,
    ):
        task = progress.add_task(f"delivering {queued} run(s)", total=queued)
        try:
            result = spool.flush(client, every_queued=True, progress=lambda: progress.advance(task))
        except SpoolUnwritable as exc:
            raise _fail(str(exc), code=SPOOL_UNWRITABLE_EXIT) from exc
    waiting = f": {result.waiting_reason}" if result.deferred else ""
    out.print(
        f"{result.delivered} delivered, {result.rejected} rejected, "
        f"{result.deferred} still waiting{waiting}",
        highlight=False,
        soft_wrap=True,
    )
    if result.deferred:
        raise typer.Exit(1)


@app.command()
def placement(
    model: Annotated[str, typer.Option(help="display name or GGUF sha256")],
    min_tps_per_user: Annotated[float, typer.Option(help="decode tokens/s each user needs")],
    prompt_tokens: Annotated[
        int | None, typer.Option(help="only points measured with prompts at least this long")
    ] = None,
    context_tokens: Annotated[
        int | None,
        typer.Option(help="tokens each user's conversation holds: refuse what would not fit"),
    ] = None,
    max_age_days: Annotated[float | None, typer.Option(help="ignore older runs")] = None,
    limit: Annotated[
        int | None, typer.Option(help="list at most this many nodes [registry default: 100]")
    ] = None,
    registry: RegistryOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """Ask the registry which node and concurrency meets a per-user speed for a model."""
    settings = _settings()
    with RegistryClient(registry or settings.registry_url, token=_token(settings)) as client:
        try:
            answer = client.placement(
                model=model,
                min_tps_per_user=min_tps_per_user,
                prompt_tokens=prompt_tokens,
                context_tokens=context_tokens,
                max_age_days=max_age_days,
                limit=limit,
            )
        except ClientError as exc:
            raise _fail(str(exc)) from exc
    if as_json:
        out.print_json(answer.model_dump_json())
    else:
        out.print(placement_table(answer))


if __name__ == "__main__":
    app()
