"""The agent's exceptions.

FleetbenchError
 ├── EngineUnavailable      the engine asked for is not installed here (an extra left out)
 ├── ClientError            talking to the registry failed
 │    ├── RegistryUnavailable   no answer, a timeout or a 5xx: try again later
 │    │    └── UnexpectedAnswer     not the registry's answer: a redirect, a page, too large
 │    └── RequestRejected       a 4xx: the registry will not take the request as it is
 └── SpoolError             the local spool cannot be read, or is of a format not read here
      └── SpoolUnwritable       ... or cannot be written (a full disk, a read-only or
                                damaged file, another process's lock held too long)

Bad input files raise ValueErrors of their own: fleetbench.agent.batched_bench_output's
BatchedBenchOutputError (NoTableFound, BadRow) and fleetbench.agent.gguf_model.ModelFileError.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

__all__ = [
    "ClientError",
    "EngineUnavailable",
    "FleetbenchError",
    "Location",
    "RegistryUnavailable",
    "RequestRejected",
    "SpoolError",
    "SpoolUnwritable",
    "UnexpectedAnswer",
    "validation_problems",
]


Location = tuple[int | str, ...]


def dotted(location: Location) -> str:
    return ".".join(str(part) for part in location)


def validation_problems(exc: ValidationError, key: Callable[[Location], str] = dotted) -> str:
    """A validation error in one line: each problem after the key it is about, as `key`
    names it (a CLI option, an agent.toml key, a variable), or alone where it is about no
    key (JSON that does not parse)."""
    named = ((key(e["loc"]), e["msg"]) for e in exc.errors(include_url=False))
    return "; ".join(f"{name}: {problem}" if name else problem for name, problem in named)


class FleetbenchError(Exception):
    """Base of the agent's errors."""


class EngineUnavailable(FleetbenchError):
    """The engine asked for cannot run on this install; the message says what to install."""


class ClientError(FleetbenchError):
    """A request to the registry failed. `retry_after`: the seconds the registry asked the
    agent to wait (its Retry-After header), None when it did not say."""

    retry_after: float | None = None


class RegistryUnavailable(ClientError):
    """The registry did not answer, timed out, or answered 5xx: retrying later may work.
    `status_code` is None when no answer came (the registry is down or unreachable)."""

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after


class UnexpectedAnswer(RegistryUnavailable):
    """What answered is not the registry's answer: a redirect (followed by none), a page
    or JSON of another shape (a proxy, a wrong URL, another version), or more than any
    answer's bytes. Tried again later, as for a registry that is down: a proxy may be
    mended, and the runs wait in the spool meanwhile. `status_code` is the status it came
    with."""


class RequestRejected(ClientError):
    """The registry answered 4xx: the request is wrong as it stands."""

    def __init__(self, status_code: int, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"registry answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
        self.retry_after = retry_after


class SpoolError(FleetbenchError):
    """The spool file cannot be read; the message names the file and why."""


class SpoolUnwritable(SpoolError):
    """The spool cannot be written (a full disk, an I/O error, a read-only file). It can
    still be read; `free_bytes` is what its file system has left."""

    def __init__(self, path: str, cause: str, free_bytes: int | None) -> None:
        free = "" if free_bytes is None else f": {free_bytes} bytes free"
        super().__init__(f"the spool at {path} cannot be written ({cause}{free})")
        self.path = path
        self.cause = cause
        self.free_bytes = free_bytes
