"""`fleetbench-registry`: migrate the database, create node tokens, serve the API, prune
old runs."""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from fleetbench.registry import crud, latest, retention
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import (
    SchemaOutOfDate,
    create_db_engine,
    ensure_schema_current,
    schema_revisions,
    session_factory,
    upgrade_schema,
    write_transaction,
)
from fleetbench.registry.metrics import MULTIPROCESS_DIR

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
token_app = typer.Typer(help="Node tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")

# Messages go to stderr: `token create` prints only the token on stdout.
err = Console(stderr=True, soft_wrap=True)


def _describe(settings: RegistrySettings) -> str:
    url = make_url(settings.sqlalchemy_url)
    if url.get_backend_name() == "sqlite":
        return f"SQLite file {url.database}"
    return f"{url.get_backend_name()} database {url.render_as_string(hide_password=True)}"


def _engine(settings: RegistrySettings) -> Engine:
    err.print(f"registry database: {_describe(settings)}")
    return create_db_engine(settings.sqlalchemy_url)


def _open(settings: RegistrySettings) -> Engine:
    """The engine, with the schema at head. The embedded default SQLite file is upgraded on
    its own; any other database is left for an explicit `migrate`."""
    engine = _engine(settings)
    try:
        if settings.is_default_sqlite:
            _upgrade(engine)
        else:
            ensure_schema_current(engine, fix_command="fleetbench-registry migrate")
    except SchemaOutOfDate as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    return engine


def _upgrade(engine: Engine) -> str | None:
    """The schema to head, then what a migration may not do itself (application code):
    the knees of curves the migrations copied. Returns the revision it was at."""
    before = upgrade_schema(engine)
    with session_factory(engine)() as session, write_transaction(session):
        filled = latest.fill_unknown_knees(session)
        session.commit()
    if filled:
        err.print(f"knees computed for {filled} curve(s) copied by the migration")
    return before


@app.command()
def migrate() -> None:
    """Upgrade the database schema to the latest revision."""
    engine = _engine(RegistrySettings())
    try:
        before = _upgrade(engine)
        _, head = schema_revisions(engine)
    except SchemaOutOfDate as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
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
) -> None:
    """Serve the registry's API and dashboard (docs at /docs)."""
    import uvicorn

    from fleetbench.registry.main import create_app

    settings = RegistrySettings()
    _open(settings).dispose()
    if workers == 1:
        uvicorn.run(
            create_app(settings), host=host, port=port, log_level="info", access_log=access_log
        )
        return
    if make_url(settings.sqlalchemy_url).get_backend_name() == "sqlite":
        err.print(
            "[yellow]warning:[/yellow] SQLite has one writer at a time: more workers serve "
            "more reads, not more reports"
        )
    # Each worker builds its own app from the same FLEETBENCH_* settings; their counters
    # meet in one folder, so that any of them answers /metrics for all.
    counters = tempfile.mkdtemp(prefix="fleetbench-metrics-")
    os.environ[MULTIPROCESS_DIR] = counters
    try:
        uvicorn.run(
            "fleetbench.registry.main:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="info",
            access_log=access_log,
        )
    finally:
        shutil.rmtree(counters, ignore_errors=True)


@token_app.command("create")
def token_create(
    node: Annotated[str, typer.Option(help="node name; created if it does not exist")],
    label: Annotated[
        list[str] | None, typer.Option(help="node label KEY=VALUE (repeatable)")
    ] = None,
) -> None:
    """Create a token for a node and print it (only the token, on standard output)."""
    labels: dict[str, str] = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"label {item!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = value
    if not node.strip():
        raise typer.BadParameter("node name is empty", param_hint="--node")
    engine = _open(RegistrySettings())
    with session_factory(engine)() as session:
        token = crud.create_node_token(session, node_name=node.strip(), labels=labels)
        session.commit()
    typer.echo(token)
    err.print(f"token created for node {node.strip()!r}; it is shown only once")


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
    sessions = session_factory(_open(settings))

    def show(pruned: retention.Pruned) -> None:
        err.print(f"  deleted {pruned.runs} runs ({pruned.points} points) so far")

    pruned = retention.prune_runs(sessions, cutoff=cutoff, dry_run=dry_run, progress=show)
    verb = "would delete" if dry_run else "deleted"
    typer.echo(
        f"{verb} {pruned.runs} runs ({pruned.points} points) started before "
        f"{cutoff:%Y-%m-%d %H:%M} UTC"
    )


if __name__ == "__main__":
    app()
