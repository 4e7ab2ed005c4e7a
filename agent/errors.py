"""The agent's exceptions.

FleetbenchError
 └── ClientError            talking to the registry failed
      ├── RegistryUnavailable   no answer, a timeout or a 5xx: try again later
      └── RequestRejected       a 4xx: the registry will not take the request as it is

Bad input files raise ValueErrors of their own: agent.batched_bench_output's
BatchedBenchOutputError (NoTableFound, BadRow) and agent.gguf_model.ModelFileError.
"""

from __future__ import annotations

__all__ = [
    "ClientError",
    "FleetbenchError",
    "RegistryUnavailable",
    "RequestRejected",
]


class FleetbenchError(Exception):
    """Base of the agent's errors."""


class ClientError(FleetbenchError):
    """A request to the registry failed."""


class RegistryUnavailable(ClientError):
    """The registry did not answer, timed out, or answered 5xx: retrying later may work."""


class RequestRejected(ClientError):
    """The registry answered 4xx: the request is wrong as it stands."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"registry answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
