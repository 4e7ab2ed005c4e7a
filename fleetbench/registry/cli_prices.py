"""`fleetbench-registry price`: each hardware class's price per hour, by which placement
prices tokens (registry.prices; the API's `/v1/prices`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from fleetbench.cli_usage import bad_parameter
from fleetbench.registry.cli_database import err, error, open_database
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import session_factory, write_transaction
from fleetbench.registry.hardware import hardware_class as class_named
from fleetbench.registry.prices.answers import HardwarePricePublic, HardwarePriceRequest
from fleetbench.registry.prices.store import list_prices, remove_price, set_price

__all__ = ["price_app"]

price_app = typer.Typer(
    help="Each hardware class's price per hour: placement prices its nodes' tokens by it.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_ARGUMENTS = {"hardware_class": "HARDWARE_CLASS", "usd_per_hour": "USD_PER_HOUR"}
HardwareClass = Annotated[
    str,
    typer.Argument(
        help="as `hardware_class` in GET /v1/nodes names it, e.g. '2x NVIDIA H100 80GB HBM3'"
    ),
]


@price_app.command("set")
def price_set(
    hardware_class: HardwareClass,
    usd_per_hour: Annotated[float, typer.Argument(help="what an hour of it costs, in US dollars")],
) -> None:
    """Set a hardware class's price per hour, replacing the one it had."""
    try:
        asked = HardwarePriceRequest(hardware_class=hardware_class, usd_per_hour=usd_per_hour)
    except ValidationError as exc:
        raise bad_parameter(exc, _ARGUMENTS, otherwise="USD_PER_HOUR") from exc
    sessions = session_factory(open_database(RegistrySettings()))
    with sessions() as session, write_transaction(session):
        set_price(session, **asked.model_dump(), set_by="fleetbench-registry price set")
        session.commit()
    err.print(f"{asked.hardware_class}: ${asked.usd_per_hour:g} an hour")


@price_app.command("list")
def price_list(
    as_json: Annotated[bool, typer.Option("--json", help="print the prices as JSON")] = False,
) -> None:
    """Every hardware class's price per hour, and when it was set."""
    with session_factory(open_database(RegistrySettings()))() as session:
        rows = [HardwarePricePublic.model_validate(row) for row in list_prices(session)]
    if as_json:
        typer.echo(json.dumps([row.model_dump(mode="json") for row in rows]))
        return
    table = Table("hardware class", "usd per hour", "set at", "set by")
    for row in rows:
        table.add_row(
            row.hardware_class, f"{row.usd_per_hour:g}", row.set_at.isoformat(), row.set_by or "-"
        )
    Console(markup=False).print(table)


@price_app.command("remove")
def price_remove(hardware_class: HardwareClass) -> None:
    """Remove a hardware class's price: its nodes' tokens are priced no more."""
    sessions = session_factory(open_database(RegistrySettings()))
    with sessions() as session, write_transaction(session):
        removed = remove_price(session, class_named(hardware_class) or hardware_class)
        session.commit()
    if not removed:
        error(f"no price is set for {hardware_class!r}")
        raise typer.Exit(1)
    err.print(f"{hardware_class}: no price")
