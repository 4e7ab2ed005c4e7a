"""The agent's exceptions.

FleetbenchError
 ├── ConfigError            bad settings or options
 ├── ClientError            talking to the registry failed
 │    ├── RegistryUnavailable   no answer, a timeout or a 5xx: try again later
 │    └── ReportRejected        a 4xx: the registry will not take it as it is
 └── (agent.batched_bench_output.NoTableFound, agent.gguf_model.ModelFileError
      are ValueErrors of their own: bad input files)
"""

from __future__ import annotations

__all__ = [
    "ClientError",
    "ConfigError",
    "FleetbenchError",
    "RegistryUnavailable",
    "ReportRejected",
]


class FleetbenchError(Exception):
    """Base of the agent's errors."""


class ConfigError(FleetbenchError):
    """Settings or options that cannot work."""


class ClientError(FleetbenchError):
    """A request to the registry failed."""


class RegistryUnavailable(ClientError):
    """The registry did not answer, timed out, or answered 5xx: retrying later may work."""


class ReportRejected(ClientError):
    """The registry answered 4xx: the request is wrong as it stands."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"registry answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
