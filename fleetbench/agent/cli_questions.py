"""`fleetbench-agent placement` and `capacity`: the registry's questions, asked from a node
or a laptop (a reader token where reads are closed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from pydantic import BaseModel
from rich.table import Table

from fleetbench.agent.cli_options import RegistryOption, command_settings
from fleetbench.agent.display import capacity_table, fail, out, placement_table
from fleetbench.agent.errors import ClientError
from fleetbench.agent.handover import registry_client
from fleetbench.contract.answers import PlacementKind

if TYPE_CHECKING:  # httpx loads when a question is asked (handover.registry_client)
    from fleetbench.agent.client import RegistryClient

__all__ = ["capacity", "placement"]

Answer = TypeVar("Answer", bound=BaseModel)

# The options both questions take.
ModelOption = Annotated[str, typer.Option(help="display name or GGUF sha256")]
MinTpsOption = Annotated[float, typer.Option(help="decode tokens/s each user needs")]
ContextTokensOption = Annotated[
    int | None,
    typer.Option(help="tokens each user's conversation holds: refuse what would not fit"),
]
MaxAgeOption = Annotated[float | None, typer.Option(help="ignore older runs")]
KindOption = Annotated[
    PlacementKind | None,
    typer.Option(
        help="offline, serving or any: each node's serving run where it has one, else "
        "its offline curve [registry default: any]"
    ),
]
MaxTtftOption = Annotated[
    float | None,
    typer.Option(help="time to first token each user may wait, ms (p90; serving runs)"),
]
TokenOption = Annotated[
    str | None, typer.Option(help="a reader token, where the registry's reads are closed")
]
JsonOption = Annotated[bool, typer.Option("--json", help="print the answer as JSON")]


def _ask(
    registry: str | None,
    token: str | None,
    question: Callable[[RegistryClient], Answer],
    *,
    table: Callable[[Answer], Table],
    as_json: bool,
) -> None:
    """Print the registry's answer (as JSON, or as its table), or fail naming why (and the
    token a closed registry wants)."""
    settings = command_settings()
    url = registry or settings.registry_url
    with registry_client(url, token or settings.current_token()) as client:
        try:
            answer = question(client)
        except ClientError as exc:
            closed = getattr(exc, "status_code", None) in (401, 403)
            hint = "; this registry's reads are closed: pass --token with a reader token"
            raise fail(str(exc) + (hint if closed else "")) from exc
    if as_json:
        out.print_json(answer.model_dump_json())
    else:
        out.print(table(answer))


def placement(
    model: ModelOption,
    min_tps_per_user: MinTpsOption,
    prompt_tokens: Annotated[
        int | None, typer.Option(help="only points measured with prompts at least this long")
    ] = None,
    context_tokens: ContextTokensOption = None,
    max_age_days: MaxAgeOption = None,
    limit: Annotated[
        int | None, typer.Option(help="list at most this many nodes [registry default: 100]")
    ] = None,
    kind: KindOption = None,
    max_ttft_ms: MaxTtftOption = None,
    registry: RegistryOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the registry which node and concurrency meets a per-user speed for a model (and
    a time to first token, from serving runs)."""
    _ask(
        registry,
        token,
        lambda client: client.placement(
            model=model,
            min_tps_per_user=min_tps_per_user,
            prompt_tokens=prompt_tokens,
            context_tokens=context_tokens,
            max_age_days=max_age_days,
            limit=limit,
            kind=kind,
            max_ttft_ms=max_ttft_ms,
        ),
        table=placement_table,
        as_json=as_json,
    )


def capacity(
    model: ModelOption,
    users: Annotated[int, typer.Option(min=1, help="concurrent users to serve")],
    min_tps_per_user: MinTpsOption,
    context_tokens: ContextTokensOption = None,
    max_ttft_ms: MaxTtftOption = None,
    kind: KindOption = None,
    max_age_days: MaxAgeOption = None,
    reserve: Annotated[
        list[str] | None,
        typer.Option(help="a node already assigned, left out (again for each one)"),
    ] = None,
    registry: RegistryOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the registry how many of which nodes serve USERS concurrent users of a model at
    a per-user speed, from each node's measured curve (and which nodes it left out, why)."""
    _ask(
        registry,
        token,
        lambda client: client.capacity(
            model=model,
            users=users,
            min_tps_per_user=min_tps_per_user,
            context_tokens=context_tokens,
            max_ttft_ms=max_ttft_ms,
            kind=kind,
            max_age_days=max_age_days,
            reserve=reserve,
        ),
        table=capacity_table,
        as_json=as_json,
    )
