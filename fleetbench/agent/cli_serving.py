"""`fleetbench-agent serve-sweep`: the server a team runs, measured as its users feel it
(fleetbench.agent.serving), printed, and with `--report` spooled and delivered."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError
from rich.progress import Progress

from fleetbench.agent.cli_options import (
    NodeTokenOption,
    RegistryOption,
    command_settings,
    int_list,
)
from fleetbench.agent.contention import (
    ContentionThresholds,
    busy_now,
    contended_warning,
    judged,
)
from fleetbench.agent.display import err, error_line, out, serving_table
from fleetbench.agent.errors import SpoolError
from fleetbench.agent.handover import hand_over, spool_run
from fleetbench.cli_answers import print_table
from fleetbench.cli_usage import help_of, options_of, validated
from fleetbench.contract.bounds import Name
from fleetbench.contract.serve_spec import ServerUrl, ServeSpec
from fleetbench.contract.wire import ModelInfo

if TYPE_CHECKING:  # the serving sweep (aiohttp) is imported by the command that runs it
    from fleetbench.agent.serving.sweep import ServingOutcome

__all__ = ["outcome_json", "serve_sweep_command"]

# The option that sets each of ServeSpec's fields: its name, without the unit of seconds.
_OPTIONS = options_of(
    ServeSpec, {field: field.removesuffix("_s") for field in ServeSpec.model_fields}
)


def outcome_json(outcome: ServingOutcome) -> dict[str, Any]:
    return {
        "server": dataclasses.asdict(outcome.server),
        "prompt_exact": outcome.prompt_exact,
        "points": [p.model_dump(mode="json") for p in outcome.points],
        "failures": [{"concurrency": c, "reason": why} for c, why in outcome.failures],
        "warnings": outcome.warnings,
        "search": dataclasses.asdict(outcome.search) if outcome.search else None,
        "postponed": outcome.postponed,
        "outputs": {"positions": len(outcome.outputs.ids), "seconds": outcome.outputs.seconds}
        if outcome.outputs
        else None,
        "contention": outcome.contention.model_dump(mode="json") if outcome.contention else None,
    }


def serve_sweep_command(
    url: Annotated[str, typer.Option(help="the server, e.g. http://127.0.0.1:8080")],
    model: Annotated[str, typer.Option(help="the model's name (OpenAI servers are asked for it)")],
    concurrency: Annotated[
        str | None,
        typer.Option(help=help_of(ServeSpec, "concurrency", "requests in flight C, comma list")),
    ] = None,
    prompt_tokens: Annotated[
        int | None, typer.Option(help=help_of(ServeSpec, "prompt_tokens", "tokens in each prompt"))
    ] = None,
    gen_tokens: Annotated[
        int | None,
        typer.Option(help=help_of(ServeSpec, "gen_tokens", "tokens each request generates")),
    ] = None,
    requests: Annotated[
        int | None, typer.Option(help="per concurrency [default: 4 C, >= 8]")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="seconds per concurrency, instead of --requests")
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(
            help="search for the largest concurrency meeting this objective, e.g. "
            "'ttft_p90<=2000ms,tps_per_user_p10>=10' (instead of --concurrency)"
        ),
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option(help=help_of(ServeSpec, "max_concurrency", "the search goes no higher")),
    ] = None,
    search_budget: Annotated[
        float | None,
        typer.Option(help=help_of(ServeSpec, "search_budget_s", "seconds the search may take")),
    ] = None,
    first_token_timeout: Annotated[
        float | None,
        typer.Option(
            help=help_of(
                ServeSpec, "first_token_timeout_s", "seconds to the first token, and between two"
            )
        ),
    ] = None,
    request_timeout: Annotated[
        float | None,
        typer.Option(help=help_of(ServeSpec, "request_timeout_s", "seconds for a request")),
    ] = None,
    no_outputs: Annotated[
        bool,
        typer.Option(
            "--no-outputs",
            help="skip a llama-server's output fingerprint on the reference text (a request "
            "per token of it, after the levels)",
        ),
    ] = False,
    node: Annotated[
        str | None, typer.Option(help="this node's name [default: FLEETBENCH_NODE]")
    ] = None,
    report: Annotated[
        bool, typer.Option("--report", help="spool the run and deliver it to the registry")
    ] = False,
    registry: RegistryOption = None,
    token: NodeTokenOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the outcome as JSON")] = False,
) -> None:
    """Measure the server a team runs: at each concurrency, exactly C streaming completions
    in flight, every token timestamped (TTFT, inter-token latency, per-user speed); or, with
    --slo, the largest concurrency that meets an objective."""
    if slo is not None and concurrency is not None:
        raise typer.BadParameter("the search chooses the concurrencies", param_hint="--slo")
    spec = validated(
        ServeSpec,
        {
            "concurrency": int_list(concurrency, "--concurrency", least=1) if concurrency else None,
            "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens,
            "requests": requests,
            "duration_s": duration,
            "slo": slo,
            "max_concurrency": max_concurrency,
            "search_budget_s": search_budget,
            "first_token_timeout_s": first_token_timeout,
            "request_timeout_s": request_timeout,
            "outputs": False if no_outputs else None,
        },
        _OPTIONS,
        otherwise="--requests or --duration",
    )
    settings = command_settings(token)
    try:  # what the report will say, checked before the sweep rather than after it
        base_url = TypeAdapter(ServerUrl).validate_python(url)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="--url") from None
    try:
        ModelInfo(name=model)
        node_name = TypeAdapter(Name).validate_python(node or settings.node)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="--model or --node") from None
    from fleetbench.agent.serving.report import finished_report
    from fleetbench.agent.serving.sweep import serve_sweep

    thresholds = ContentionThresholds.of(settings)
    if (busy := busy_now(thresholds)) is not None:
        err.print(f"warning: {busy}", highlight=False, soft_wrap=True)
    started_at = datetime.now(UTC)
    steps = 1 + spec.max_concurrency.bit_length() * 2 if spec.slo else len(spec.concurrency)
    with Progress(console=err, transient=True, disable=as_json) as progress:
        task = progress.add_task(f"{base_url}: concurrency", total=steps)
        outcome = serve_sweep(base_url, model, spec, on_point=lambda _: progress.advance(task))
    outcome.contention = judged(outcome.contention, thresholds)
    for warning in outcome.warnings:
        err.print(f"warning: {warning}", soft_wrap=True)
    if as_json:
        out.print_json(json.dumps(outcome_json(outcome)))
    else:
        server = outcome.server
        said = f"{server.kind} {server.build or ''}".strip()
        title = f"{model} on {said} at {base_url}: prompt {spec.prompt_tokens}, "
        table = serving_table(outcome.points, title=title + f"output {spec.gen_tokens} tokens")
        print_table(out, table)
        if outcome.search is not None:
            found = outcome.search
            best = "none" if found.concurrency is None else str(found.concurrency)
            out.print(
                f"largest concurrency meeting {found.objective}: {best} ({found.stop_reason})",
                soft_wrap=True,
                highlight=False,
            )
        if outcome.outputs is not None:
            taken = outcome.outputs
            out.print(
                f"output fingerprint: {len(taken.ids)} positions of {taken.text_version} in "
                f"{taken.seconds or 0:.1f} s",
                soft_wrap=True,
                highlight=False,
            )
    if outcome.postponed is not None:
        err.print(error_line(f"{outcome.postponed}; try again later"), soft_wrap=True)
        raise typer.Exit(1)
    for level, why in outcome.failures:
        err.print(error_line(f"concurrency {level}: {why}"), soft_wrap=True)
    if (contended := contended_warning(outcome.contention)) is not None:
        err.print(f"warning: {contended}", highlight=False, soft_wrap=True)
    if report:
        run = finished_report(outcome, spec, model=model, node=node_name, started_at=started_at)
        spooled = spool_run(run, settings)
        if isinstance(spooled, SpoolError):
            out.print_json(run.model_dump_json())  # kept on stdout, as hand_over says
        hand_over(run, spooled, settings, registry)
    if outcome.failures:
        raise typer.Exit(1)
