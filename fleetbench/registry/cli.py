"""`fleetbench-registry`: migrate the database, manage tokens, sweep plans and hardware
prices, serve the API, prune old runs, compare two builds across the fleet."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from fleetbench import cli_compare
from fleetbench.cli_answers import (
    NO_ANSWER_EXIT,
    USAGE_EXIT,
    JsonOption,
    ModelOption,
    console,
    version_option,
)
from fleetbench.cli_usage import bad_parameter, options_of
from fleetbench.contract.bounds import Name
from fleetbench.contract.plans import PlanBody
from fleetbench.registry import crud, plans, retention, tokens
from fleetbench.registry.cli_database import engine_of, err, error, open_database
from fleetbench.registry.cli_prices import price_app
from fleetbench.registry.compare.answer import CompareAnswer, compare_builds
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import (
    SchemaOutOfDate,
    schema_revisions,
    session_factory,
    upgrade_schema,
    write_transaction,
)
from fleetbench.registry.projections import REBUILT, rebuilt_named
from fleetbench.registry.projections.rebuild import Rebuilt
from fleetbench.registry.projections.rebuild import rebuild as rebuild_projections
from fleetbench.registry.schemas import TokenPublic, TokenRequest, token_public

# rich_markup_mode=None: the helps' "[default: ...]" shown as written, not read as markup
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, rich_markup_mode=None)
token_app = typer.Typer(
    help="Tokens: node, reader and admin.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(token_app, name="token")
plan_app = typer.Typer(
    help="Sweep plans: what the fleet sweeps, versioned.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(plan_app, name="plan")
app.add_typer(price_app, name="price")


@app.callback()
def _every_command(
    _version: Annotated[bool, version_option("fleetbench-registry")] = False,
) -> None:
    pass


# The option that sets each of TokenRequest's fields, to name in a usage error.
_TOKEN_OPTIONS = options_of(TokenRequest, {"expires_in_days": "expires_days"})


@app.command()
def migrate() -> None:
    """Upgrade the database schema to the latest revision."""
    engine = engine_of(RegistrySettings())
    try:
        before = upgrade_schema(engine)
        _, head = schema_revisions(engine)
    except SchemaOutOfDate as exc:
        error(str(exc))
        raise typer.Exit(1) from exc
    if before == head:
        err.print(f"schema already at {head}")
    else:
        err.print(f"schema upgraded from {before or 'empty'} to {head}")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8787,
    workers: Annotated[
        int,
        typer.Option(
            min=1, max=64, help="worker processes (PostgreSQL: about one per core; SQLite: 1)"
        ),
    ] = 1,
    access_log: Annotated[
        bool,
        typer.Option(
            "--access-log/--no-access-log",
            help="log every request (a fleet's reports: hundreds a second; /metrics counts them)",
        ),
    ] = False,
    ssl_certfile: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="serve HTTPS: certificate")
    ] = None,
    ssl_keyfile: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="... and its private key")
    ] = None,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            help="proxies whose X-Forwarded-For and -Proto to trust, e.g. 127.0.0.1 (the "
            "client address limits refused tokens); default: FLEETBENCH_FORWARDED_ALLOW_IPS, "
            "else none"
        ),
    ] = None,
) -> None:
    """Serve the registry's API and dashboard (docs at /docs), in plain HTTP unless given a
    certificate: a fleet reaches it through a TLS proxy, or with --ssl-certfile."""
    import uvicorn  # the server's stack (FastAPI with it) loads for `serve` alone

    from fleetbench.registry.http_server import uvicorn_options
    from fleetbench.registry.main import served_app
    from fleetbench.registry.metrics import MULTIPROCESS_DIR

    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise typer.BadParameter("give both or neither", param_hint="--ssl-certfile/--ssl-keyfile")
    settings = RegistrySettings()
    open_database(settings).dispose()
    served = {
        "host": host,
        "port": port,
        "log_level": "info",
        "access_log": access_log,
        "ssl_certfile": ssl_certfile,
        "ssl_keyfile": ssl_keyfile,
        **uvicorn_options(settings, forwarded_allow_ips),
    }
    if workers == 1:
        uvicorn.run(served_app(settings), **served)
        return
    if make_url(settings.sqlalchemy_url).get_backend_name() == "sqlite":
        err.print(
            Text.assemble(
                ("warning:", "yellow"),
                " SQLite has one writer at a time: more workers serve more reads, not more reports",
            )
        )
    # Each worker builds its own app from the same FLEETBENCH_* settings; their counters
    # meet in one folder, so that any of them answers /metrics for all.
    counters = tempfile.mkdtemp(prefix="fleetbench-metrics-")
    os.environ[MULTIPROCESS_DIR] = counters
    try:
        uvicorn.run(
            "fleetbench.registry.main:served_app",
            factory=True,
            workers=workers,
            **served,
        )
    finally:
        shutil.rmtree(counters, ignore_errors=True)


@token_app.command("create")
def token_create(
    node: Annotated[
        str | None, typer.Option(help="a node token's node; created if it does not exist")
    ] = None,
    scope: Annotated[str, typer.Option(help="node, reader or admin")] = "node",
    name: Annotated[
        str | None, typer.Option(help="what lists and acknowledgements call it")
    ] = None,
    expires_days: Annotated[
        float | None, typer.Option(help="it stops working after this many days")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="node label KEY=VALUE (repeatable)")
    ] = None,
) -> None:
    """Create a token and print it (only the token, on standard output)."""
    try:  # the API's rules: scope, the node's name as reports spell it, bounds
        asked = TokenRequest.model_validate(
            {"scope": scope, "node": node, "name": name, "expires_in_days": expires_days}
        )
    except ValidationError as exc:  # a rule across fields is the node's
        raise bad_parameter(exc, _TOKEN_OPTIONS, otherwise="--node") from None
    labels: dict[str, str] = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"label {item!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = value
    with session_factory(open_database(RegistrySettings()))() as session:
        token, secret = tokens.create_token(
            session,
            scope=asked.scope,
            node_name=asked.node,
            labels=labels,
            name=asked.name,
            expires_at=tokens.expiry_after(asked.expires_in_days),
        )
        session.commit()
        said = tokens.display_name(token.name, token.scope, token.id)
    typer.echo(secret)
    err.print(f"{scope} token {said!r} created; it is shown only once")


@token_app.command("list")
def token_list(
    as_json: Annotated[bool, typer.Option("--json", help="print the tokens as JSON")] = False,
) -> None:
    """Every token, without its secret: id, scope, name, node, state and when it was made,
    last used and expires."""
    with session_factory(open_database(RegistrySettings()))() as session:
        rows = [token_public(t).model_dump(mode="json") for t in tokens.list_tokens(session)]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(*(name.replace("_", " ") for name in TokenPublic.model_fields))
    for row in rows:
        table.add_row(*(str(v) if v is not None else "-" for v in row.values()))
    Console(markup=False).print(table)


TokenId = Annotated[int, typer.Argument(min=1, help="its id (token list)")]


@token_app.command("revoke")
def token_revoke(token_id: TokenId) -> None:
    """Revoke a token: every registry process refuses it within a second."""
    with session_factory(open_database(RegistrySettings()))() as session:
        token = tokens.revoke_token(session, token_id=token_id)
        session.commit()
    if token is None:
        error(f"no token {token_id}")
        raise typer.Exit(1)
    err.print(f"token {token_id} revoked")


@token_app.command("rotate")
def token_rotate(
    token_id: TokenId,
    grace_hours: Annotated[
        float, typer.Option(min=0, max=8760, help="the old token keeps working this long")
    ] = 24,
) -> None:
    """Replace a token with a new one of the same scope, node and name, printed on standard
    output; the old one keeps working for the grace period, so runs spooled meanwhile are
    delivered whichever token the agent holds."""
    with session_factory(open_database(RegistrySettings()))() as session:
        try:
            rotated = tokens.rotate_token(
                session, token_id=token_id, grace=timedelta(hours=grace_hours)
            )
        except tokens.AlreadyRotated as exc:
            error(str(exc))
            raise typer.Exit(1) from None
        session.commit()
        if rotated is None:
            error(f"no active token {token_id}")
            raise typer.Exit(1)
        old, new, secret = rotated
        ends = old.expires_at
    typer.echo(secret)
    err.print(f"token {token_id} replaced by token {new.id}; the old one works until {ends}")


@app.command()
def prune(
    days: Annotated[
        float | None,
        typer.Option(
            min=0.01, help="keep every run this long [default: FLEETBENCH_RETENTION_DAYS]"
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count, delete nothing")] = False,
) -> None:
    """Delete old runs: every run is kept for DAYS, then the newest successful run of each
    node, model and build, the runs regressions name and each node's latest curves. Safe
    while the registry serves (small batches, each its own transaction)."""
    settings = RegistrySettings()
    keep = days if days is not None else settings.retention_days
    if keep is None:
        raise typer.BadParameter(
            "give --days or set FLEETBENCH_RETENTION_DAYS", param_hint="--days"
        )
    cutoff = datetime.now(UTC) - timedelta(days=keep)
    sessions = session_factory(open_database(settings))

    def show(pruned: retention.Pruned) -> None:
        err.print(f"  deleted {pruned.runs} runs ({pruned.points} points) so far")

    pruned = retention.prune_runs(sessions, cutoff=cutoff, dry_run=dry_run, progress=show)
    verb = "would delete" if dry_run else "deleted"
    typer.echo(
        f"{verb} {pruned.runs} runs ({pruned.points} points) started before "
        f"{cutoff:%Y-%m-%d %H:%M} UTC"
    )


@app.command()
def rebuild(
    projection: Annotated[
        list[str] | None,
        typer.Option(
            help="only this projection (again for each one): " + ", ".join(p.name for p in REBUILT)
        ),
    ] = None,
) -> None:
    """Make the tables derived from the runs (the projections: each node's activity, latest
    curves and serving runs, the comparison's sums) again from the runs alone. Safe while
    the registry serves (a few nodes per transaction)."""
    try:
        chosen = [rebuilt_named(name) for name in projection] if projection else REBUILT
    except KeyError as exc:
        raise typer.BadParameter(exc.args[0], param_hint="--projection") from None
    sessions = session_factory(open_database(RegistrySettings()))

    def show(rebuilt: Rebuilt) -> None:
        err.print(f"  {rebuilt.nodes} of {rebuilt.total} nodes rebuilt")

    rebuilt = rebuild_projections(sessions, chosen, progress=show)
    names = ", ".join(p.name for p in chosen)
    typer.echo(f"rebuilt {names} for {rebuilt.nodes} nodes")


@plan_app.command("apply")
def plan_apply(
    name: Annotated[str, typer.Argument(help="the plan's name")],
    file: Annotated[Path, typer.Argument(help="the plan: a TOML or JSON file", exists=True)],
) -> None:
    """Save the plan in FILE as NAME's next version (nothing, if it is the current one)."""
    try:
        name = TypeAdapter(Name).validate_python(name)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="NAME") from None
    try:
        text = file.read_text()
        body = PlanBody.model_validate(
            json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
        )
    except ValidationError as exc:  # every problem, by its key in the file
        problems = exc.errors(include_url=False)
        error(f"{file}: " + "; ".join(f"{_dotted(p['loc'])}: {p['msg']}" for p in problems))
        raise typer.Exit(2) from None
    except (OSError, ValueError) as exc:  # unreadable, or not TOML or JSON
        error(f"{file}: {exc}")
        raise typer.Exit(2) from None
    settings = RegistrySettings()
    with session_factory(open_database(settings))() as session, write_transaction(session):
        try:
            saved = plans.save_plan(
                session,
                name,
                body,
                by="fleetbench-registry plan apply",
                max_points=settings.max_points_per_report,
            )
        except plans.PlanRefused as exc:
            error(f"{file}: {exc}")
            raise typer.Exit(2) from exc
        except plans.PlanChanged as exc:
            error(str(exc))
            raise typer.Exit(1) from exc
        session.commit()
    said = "saved as" if saved.new_version else "unchanged at"
    typer.echo(f"plan {name!r} {said} version {saved.plan.version}")


def _dotted(location: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in location) or "plan"


@plan_app.command("list")
def plan_list(
    name: Annotated[str | None, typer.Argument(help="one plan: every version of it")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print them as JSON")] = False,
) -> None:
    """Every plan's current version, or (NAME) every version of one plan, newest first."""
    with session_factory(open_database(RegistrySettings()))() as session:
        found = plans.plan_history(session, name) if name else plans.current_plans(session)
    if name and not found:
        error(f"no plan {name!r}")
        raise typer.Exit(1)
    rows = [plan.model_dump(mode="json") for plan in found]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    columns = ("name", "version", "enabled", "nodes", "labels", "model", "cron", "created_by")
    table = Table(*(column.replace("_", " ") for column in columns))
    for row in rows:
        table.add_row(
            *(
                json.dumps(row[c]) if isinstance(row[c], dict | list) else str(row[c])
                for c in columns
            )
        )
    Console(markup=False).print(table)


@plan_app.command("retire")
def plan_retire(name: Annotated[str, typer.Argument(help="the plan's name")]) -> None:
    """Stop every node running the plan (a version of it that is off; all stay on record)."""
    with (
        session_factory(open_database(RegistrySettings()))() as session,
        write_transaction(session),
    ):
        try:
            saved = plans.retire_plan(session, name, by="fleetbench-registry plan retire")
        except (plans.PlanRefused, plans.PlanChanged) as exc:
            error(str(exc))
            raise typer.Exit(1) from exc
        if saved is None:
            error(f"no plan {name!r}")
            raise typer.Exit(1)
        session.commit()
    typer.echo(f"plan {name!r} retired at version {saved.plan.version}")


@plan_app.command("sweep-now")
def plan_sweep_now(node: Annotated[str, typer.Argument(help="the node's name")]) -> None:
    """Ask a node to run every plan of its now: it does at its next poll."""
    with (
        session_factory(open_database(RegistrySettings()))() as session,
        write_transaction(session),
    ):
        found = crud.find_node(session, node)
        if found is None:
            error(f"node {node!r} not found")
            raise typer.Exit(1)
        plans.request_sweep(session, found.id)
        session.commit()
    typer.echo(f"node {node!r} sweeps at its next poll")


@app.command(epilog=cli_compare.compare_help("the database unreachable, or its schema behind"))
def compare(
    model: ModelOption,
    from_build: cli_compare.FromBuildOption,
    to_build: cli_compare.ToBuildOption,
    kind: cli_compare.CompareKindOption = "offline",
    max_age_days: Annotated[
        float | None, typer.Option(min=0.001, max=36_500, help="only runs this recent")
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=100_000, help="list at most this many nodes, worst first")
    ] = 100,
    as_json: JsonOption = False,
    as_markdown: cli_compare.MarkdownOption = False,
) -> None:
    """Is TO_BUILD safe to roll out? Every node that ran both builds, compared point by
    point, and a verdict per hardware class (go, hold, unknown), read from the database: the
    operators' command. A CI gate asks the registry instead, with a reader token:
    `fleetbench-agent compare --token T` (the same answer and exit statuses)."""
    cli_compare.check_one_format(as_json=as_json, as_markdown=as_markdown)
    settings = RegistrySettings()
    try:
        with session_factory(open_database(settings))() as session:
            models = crud.find_models(session, model)
            answer: CompareAnswer | None = None
            if models:
                answer = compare_builds(
                    session,
                    models,
                    from_build=from_build,
                    to_build=to_build,
                    kind=kind,
                    max_age_days=max_age_days,
                    settings=settings.compare_settings(),
                    limit=limit,
                )
    except typer.Exit as exc:  # `open_database`'s, for a schema behind (it said so): no answer
        raise typer.Exit(NO_ANSWER_EXIT) from exc
    except SQLAlchemyError as exc:
        error(f"the database cannot be read: {exc}")
        raise typer.Exit(NO_ANSWER_EXIT) from exc
    if answer is None:
        error(f"model {model!r} not found")
        raise typer.Exit(USAGE_EXIT)
    cli_compare.print_compare(console(), answer, as_json=as_json, as_markdown=as_markdown)
    raise typer.Exit(cli_compare.verdict_exit(answer.verdict))


if __name__ == "__main__":
    app()
