"""`fleetbench-registry`: migrate the database, create node tokens, serve the API."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from registry import crud
from registry.config import RegistrySettings
from registry.db import (
    SchemaOutOfDate,
    create_db_engine,
    ensure_schema_current,
    schema_revisions,
    session_factory,
    upgrade_schema,
)

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
            upgrade_schema(engine)
        else:
            ensure_schema_current(engine, fix_command="fleetbench-registry migrate")
    except SchemaOutOfDate as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    return engine


@app.command()
def migrate() -> None:
    """Upgrade the database schema to the latest revision."""
    engine = _engine(RegistrySettings())
    try:
        before, head = schema_revisions(engine)
    except SchemaOutOfDate as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    upgrade_schema(engine)
    if before == head:
        err.print(f"schema already at {head}")
    else:
        err.print(f"schema upgraded from {before or 'empty'} to {head}")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8787,
) -> None:
    """Serve the registry's API (docs at /docs)."""
    import uvicorn

    from registry.main import create_app

    settings = RegistrySettings()
    _open(settings).dispose()
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")


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


if __name__ == "__main__":
    app()
