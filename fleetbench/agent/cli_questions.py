"""`fleetbench-agent placement`, `capacity`, `compare` and `regressions`: the registry's
questions, asked
from a node, a laptop or a CI job (a reader token where reads are closed: a rollout gate
needs no database credentials)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from pydantic import BaseModel
from rich.table import Table

from fleetbench.agent.cli_options import RegistryOption, command_settings
from fleetbench.agent.display import (
    capacity_table,
    fail,
    out,
    placement_table,
    regressions_table,
)
from fleetbench.agent.errors import ClientError
from fleetbench.agent.handover import registry_client
from fleetbench.cli_answers import (
    ANSWERED_EXIT,
    NO_ANSWER_EXIT,
    USAGE_EXIT,
    JsonOption,
    ModelOption,
    exit_status_help,
    print_table,
)
from fleetbench.cli_compare import (
    CompareKindOption,
    FromBuildOption,
    MarkdownOption,
    ToBuildOption,
    check_one_format,
    compare_help,
    print_compare,
    verdict_exit,
)
from fleetbench.contract.answers import CapacityMinimise, PlacementKind, PlacementOrder

if TYPE_CHECKING:  # httpx loads when a question is asked (handover.registry_client)
    from fleetbench.agent.client import RegistryClient

__all__ = ["COMPARE_HELP", "QUESTION_HELP", "capacity", "compare", "placement", "regressions"]

Answer = TypeVar("Answer", bound=BaseModel)

# The exit statuses, for the helps; a script tells an outage from an answer by them.
_NO_ANSWER = "the registry unreachable, the token refused, a server error"
QUESTION_HELP = exit_status_help(f"{ANSWERED_EXIT} an answer, whatever it finds", _NO_ANSWER)
COMPARE_HELP = compare_help(_NO_ANSWER)
# The registry's answers to a question it will not take as asked: a usage error.
_REFUSED_AS_ASKED = (400, 404, 422)

# The options the questions take (and ModelOption, JsonOption: fleetbench.cli_answers).
MinTpsOption = Annotated[float, typer.Option(help="decode tokens/s each user needs")]
ContextTokensOption = Annotated[
    int | None,
    typer.Option(help="tokens each user's conversation holds: refuse what would not fit"),
]
MaxAgeOption = Annotated[float | None, typer.Option(help="ignore older runs")]
LimitOption = Annotated[
    int | None, typer.Option(help="list at most this many nodes [registry default: 100]")
]
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


def _asked(
    registry: str | None, token: str | None, question: Callable[[RegistryClient], Answer]
) -> Answer:
    """The registry's answer; else one line saying why there is none (and the token a closed
    registry wants), exiting 2 where the registry refused the question as asked (a model it
    does not know: 404), 4 where it gave no answer (or not one read here: a registry of
    another version, a proxy's page)."""
    settings = command_settings()
    url = registry or settings.registry_url
    with registry_client(url, token or settings.current_token()) as client:
        try:
            return question(client)
        except ClientError as exc:
            status = getattr(exc, "status_code", None)
            closed = status in (401, 403)
            hint = "; this registry's reads are closed: pass --token with a reader token"
            code = USAGE_EXIT if status in _REFUSED_AS_ASKED else NO_ANSWER_EXIT
            raise fail(str(exc) + (hint if closed else ""), code=code) from exc


def _print_answer(answer: Answer, table: Callable[[Answer], Table], *, as_json: bool) -> None:
    if as_json:
        out.print_json(answer.model_dump_json())
    else:
        print_table(out, table(answer))


def placement(
    model: ModelOption,
    min_tps_per_user: MinTpsOption,
    prompt_tokens: Annotated[
        int | None, typer.Option(help="only points measured with prompts at least this long")
    ] = None,
    context_tokens: ContextTokensOption = None,
    max_age_days: MaxAgeOption = None,
    limit: LimitOption = None,
    kind: KindOption = None,
    max_ttft_ms: MaxTtftOption = None,
    order: Annotated[
        PlacementOrder | None,
        typer.Option(
            help="throughput: best total throughput first; cost: the cheapest per million "
            "tokens first, by each hardware class's price (fleetbench-registry price) "
            "[registry default: throughput]"
        ),
    ] = None,
    registry: RegistryOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the registry which node and concurrency meets a per-user speed for a model (and
    a time to first token, from serving runs), best throughput or cheapest tokens first."""
    answer = _asked(
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
            order=order,
        ),
    )
    _print_answer(answer, placement_table, as_json=as_json)


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
    minimise: Annotated[
        CapacityMinimise | None,
        typer.Option(
            help="nodes: the fewest nodes; cost: the cheapest an hour, by each hardware "
            "class's price (fleetbench-registry price), nodes without one left out "
            "[registry default: nodes]"
        ),
    ] = None,
    registry: RegistryOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the registry how many of which nodes serve USERS concurrent users of a model at
    a per-user speed, from each node's measured curve, the fewest or the cheapest (and
    which nodes it left out, why)."""
    answer = _asked(
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
            minimise=minimise,
        ),
    )
    _print_answer(answer, capacity_table, as_json=as_json)


def compare(
    model: ModelOption,
    from_build: FromBuildOption,
    to_build: ToBuildOption,
    kind: CompareKindOption = "offline",
    max_age_days: MaxAgeOption = None,
    limit: LimitOption = None,
    registry: RegistryOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
    as_markdown: MarkdownOption = False,
) -> None:
    """Is TO_BUILD safe to roll out after FROM_BUILD? Asks the registry (a CI gate's way:
    a reader token, no database credentials): every node that ran both builds, compared
    point by point, worst first, and a verdict per hardware class (go, hold, unknown)."""
    check_one_format(as_json=as_json, as_markdown=as_markdown)
    answer = _asked(
        registry,
        token,
        lambda client: client.compare(
            model=model,
            from_build=from_build,
            to_build=to_build,
            kind=kind,
            max_age_days=max_age_days,
            limit=limit,
        ),
    )
    print_compare(out, answer, as_json=as_json, as_markdown=as_markdown)
    raise typer.Exit(verdict_exit(answer.verdict))


def regressions(
    node: Annotated[str | None, typer.Option(help="one node's")] = None,
    model: Annotated[str | None, typer.Option(help="one model's (a name or sha256:...)")] = None,
    min_change: Annotated[
        float | None, typer.Option(min=0, help="the least change, % either way")
    ] = None,
    include_improvements: Annotated[
        bool, typer.Option("--improvements", help="list steps that got faster too")
    ] = False,
    include_acknowledged: Annotated[
        bool, typer.Option("--acknowledged", help="list those an admin acknowledged too")
    ] = False,
    limit: Annotated[
        int | None, typer.Option(min=1, help="list at most this many [registry default: 1000]")
    ] = None,
    registry: RegistryOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Did an upgrade make a node slower? Every lasting step in a node's series that nobody
    acknowledged, newest first: its size against the series' noise and its cause (build,
    driver, settings, hardware)."""
    answer = _asked(
        registry,
        token,
        lambda client: client.regressions(
            node=node,
            model=model,
            min_change=min_change,
            include_improvements=include_improvements,
            include_acknowledged=include_acknowledged,
            limit=limit,
        ),
    )
    _print_answer(answer, regressions_table, as_json=as_json)
