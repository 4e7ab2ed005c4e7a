"""`fleetbench-agent`: report llama-batched-bench results to the registry and query it."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from agent.batched_bench_output import BatchedBenchOutputError
from agent.client import RegistryClient
from agent.config import AgentSettings
from agent.display import curve_table, placement_table, spool_table
from agent.errors import ClientError, RequestRejected
from agent.fingerprint import take_fingerprint
from agent.gguf_model import ModelFileError, describe_gguf
from agent.importer import reports_from_output
from agent.spool import Spool
from agent.wire import ModelInfo

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
out = Console()
err = Console(stderr=True)

RegistryOption = Annotated[
    str | None,
    typer.Option("--registry", help="registry URL [env: FLEETBENCH_REGISTRY_URL]"),
]


def _field_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


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
    settings = AgentSettings()
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
        info = describe_gguf(model_file, name=model) if model_file else ModelInfo(name=model)
        when = measured_at or datetime.fromtimestamp(file.stat().st_mtime, UTC)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        reports = reports_from_output(text, node=node, model=info, measured_at=when)
    except (OSError, ModelFileError) as exc:
        raise _fail(str(exc)) from exc
    except BatchedBenchOutputError as exc:
        raise _fail(f"{file}: {exc}") from exc
    except ValidationError as exc:  # --node or --model that no report may carry
        raise _fail(_field_errors(exc)) from exc

    if dry_run:
        out.print_json(json.dumps([r.report.model_dump(mode="json") for r in reports]))
        return
    secret = token or (settings.token.get_secret_value() if settings.token else None)
    if not secret:
        raise _fail(
            "no registry token: pass --token or set FLEETBENCH_TOKEN "
            "(create one with `fleetbench-registry token create --node NAME`)",
            code=2,
        )
    url = registry or settings.registry_url
    with RegistryClient(url, token=secret) as client:
        for number, (line, report) in enumerate(reports, start=1):
            build = report.engine.build_number
            err.print(
                curve_table(
                    report.points,
                    title=f"run {number}/{len(reports)} (line {line}): {model} on {node}"
                    + (f", llama.cpp build {build}" if build is not None else ""),
                )
            )
            try:
                receipt = client.submit_run(report)
            except RequestRejected as exc:
                if exc.status_code == 409:
                    raise _fail(
                        f"run {report.run_id} was imported before with another measurement "
                        "time; pass --measured-at with the time it was imported with"
                    ) from exc
                raise _fail(f"run {report.run_id} not stored: {exc}") from exc
            except ClientError as exc:
                sent = f" ({number - 1} of {len(reports)} sent before it)" if number > 1 else ""
                raise _fail(f"run {report.run_id} not stored{sent}: {exc}") from exc
            out.print(
                f"{receipt.outcome}: run {receipt.run_id} ({receipt.points} points) at {url}",
                soft_wrap=True,
            )


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
    """Runs in the local spool: queued for delivery, delivered, and rejected (with why)."""
    spool = Spool(AgentSettings().spool)
    runs = spool.runs()
    if as_json:
        out.print_json(json.dumps([dataclasses.asdict(r) for r in runs]))
        return
    counts = spool.counts()
    out.print(
        f"spool {spool.path}: {counts['queued']} queued, {counts['delivered']} delivered, "
        f"{counts['rejected']} rejected",
        soft_wrap=True,
    )
    waiting = [r for r in runs if r.state != "delivered"]
    if waiting:
        out.print(spool_table(waiting))


@app.command()
def placement(
    model: Annotated[str, typer.Option(help="display name or GGUF sha256")],
    min_tps_per_user: Annotated[float, typer.Option(help="decode tokens/s each user needs")],
    prompt_tokens: Annotated[
        int | None, typer.Option(help="only points measured with prompts at least this long")
    ] = None,
    max_age_days: Annotated[float | None, typer.Option(help="ignore older runs")] = None,
    limit: Annotated[
        int | None, typer.Option(help="list at most this many nodes [registry default: 100]")
    ] = None,
    registry: RegistryOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """Ask the registry which node and concurrency meets a per-user speed for a model."""
    settings = AgentSettings()
    token = settings.token.get_secret_value() if settings.token else None
    with RegistryClient(registry or settings.registry_url, token=token) as client:
        try:
            answer = client.placement(
                model=model,
                min_tps_per_user=min_tps_per_user,
                prompt_tokens=prompt_tokens,
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
