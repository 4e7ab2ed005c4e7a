"""How the CLI's commands hand runs to the registry: through the spool (`import`,
`sweep --report`), or straight to the registry when the spool cannot take them, and what
they say became of each run. Nothing is lost silently: a run not stored is queued, or on
stdout, and the exit status says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from fleetbench.agent.config import AgentSettings, open_spool
from fleetbench.agent.display import SPOOL_UNWRITABLE_EXIT, err, fail, out
from fleetbench.agent.errors import ClientError, SpoolError, SpoolUnwritable
from fleetbench.agent.spool import Spool
from fleetbench.contract.wire import RunReport

if TYPE_CHECKING:
    from fleetbench.agent.client import RegistryClient

__all__ = [
    "deliver",
    "deliver_unspooled",
    "hand_over",
    "import_through_the_spool",
    "registry_client",
    "spool_run",
]


def registry_client(url: str, token: str | None) -> RegistryClient:
    """A client of the registry at `url`. httpx is loaded here, when something is delivered:
    a sweep that only spools or prints starts without it."""
    from fleetbench.agent.client import RegistryClient

    return RegistryClient(url, token=token)


def import_through_the_spool(
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
                raise fail(
                    f"{exc}{before}; nothing else was sent", code=SPOOL_UNWRITABLE_EXIT
                ) from exc
            except ValueError as exc:  # delivered before with another measurement time
                raise fail(f"{exc}: {_IMPORTED_BEFORE}") from exc
        ids = {str(r.run_id) for r in reports}
        with registry_client(url, token=token) as client:
            result = spool.flush(client, every_queued=True, only=ids)
        states = {r.run_id: r for r in spool.runs() if r.run_id in ids}
    except SpoolError as exc:  # unreadable, of another format, or the disk filled meanwhile
        again = "; import again once the spool can be written"
        raise fail(
            f"{exc}{again if isinstance(exc, SpoolUnwritable) else ''}",
            code=SPOOL_UNWRITABLE_EXIT,
        ) from exc
    failed = False
    for report in reports:
        run_id = str(report.run_id)
        receipt, state = result.receipts.get(run_id), states.get(run_id)
        if receipt is not None:
            moved = receipt.stored_as not in (None, report.run_id)
            stored_as = f", stored as {receipt.stored_as}" if moved else ""
            out.print(
                f"{receipt.outcome}: run {run_id} ({receipt.points} points{stored_as}) at {url}",
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
        err.print(f"error: run {run_id} not stored: {why}", highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


_IMPORTED_BEFORE = (
    "it was imported before with another measurement time; pass --measured-at with the "
    "time it was imported with"
)


def spool_run(run: RunReport, settings: AgentSettings) -> Spool | SpoolError:
    """The spool holding the run, or why it cannot take it (a full disk, a file this agent
    does not read)."""
    try:
        spool = open_spool(settings)
        spool.add(run)
    except SpoolError as exc:
        return exc
    return spool


def hand_over(
    run: RunReport, spooled: Spool | SpoolError, settings: AgentSettings, registry: str | None
) -> None:
    """Delivers a run `spool_run` took (or, when the spool could not, straight to the
    registry; the caller has printed it on stdout by then)."""
    if isinstance(spooled, SpoolError):
        deliver_unspooled(run, spooled, settings, registry)
    else:
        deliver(run, spooled, settings, registry)


def deliver(run: RunReport, spool: Spool, settings: AgentSettings, registry: str | None) -> None:
    with registry_client(
        registry or settings.registry_url, token=settings.current_token()
    ) as client:
        try:
            result = spool.flush(client)
        except SpoolUnwritable as exc:
            raise fail(
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


def deliver_unspooled(
    run: RunReport, problem: SpoolError, settings: AgentSettings, registry: str | None
) -> None:
    """The spool cannot take the run (it is on stdout as JSON by now): hand it to the
    registry directly, once. Delivered, that is said and the command goes on (exit 0, or 1
    for a failed run); not delivered, one line says why and the command exits 3, so nothing
    is lost silently: `sweep --report > run.json` keeps the run."""
    url = registry or settings.registry_url
    try:
        with registry_client(url, token=settings.current_token()) as client:
            client.submit_run(run)
    except ClientError as exc:
        raise fail(
            f"{problem}, and the registry did not take the run directly ({exc}); "
            "the run is printed on stdout as JSON",
            code=SPOOL_UNWRITABLE_EXIT,
        ) from exc
    err.print(
        f"warning: {problem}; run {run.run_id} was delivered to {url} directly",
        highlight=False,
        soft_wrap=True,
    )
