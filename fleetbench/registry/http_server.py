"""How `fleetbench-registry serve` runs uvicorn: whose forwarded addresses it believes, what
its logs keep of a request, and how large a request's head it reads.

- Forwarded headers: uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise,
  so anything on the registry's own host (a sidecar, a local user) could name a new address
  with each wrong token and never be refused 429. Only the proxies the settings name are
  believed; by default none.
- Logs: every line goes through EscapingFormatter (what a request says of itself, a proxied
  client address, cannot break a line), and an access log line keeps a request's query
  string with the values of secret-looking parameters redacted. Redacted rather than
  dropped: this API's reads are their query strings (placement, capacity, compare), and a
  log without them cannot say what was asked. The registry reads tokens from the
  Authorization header alone; a token in a query string is a client's mistake, caught by
  the parameter's name or by the shape of the registry's own tokens.
- Request heads: llhttp (httptools, uvicorn's fastest parser, which `serve` keeps) buffers
  a header of any size; BoundedHeadProtocol answers 431 past the bound. Where httptools is
  not installed, uvicorn's h11 protocol refuses (400) past the same bound."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
from typing import Any
from urllib.parse import unquote_plus

from fleetbench.printable import EscapingFormatter
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.tokens import PREFIXES

__all__ = ["RedactingFormatter", "log_config", "redact", "uvicorn_options"]

REDACTED = "[redacted]"
# Parameter names, lower case, whose values are secrets wherever they appear...
_SECRET_NAMES = frozenset(
    {
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth",
        "authorization",
        "key",
        "api_key",
        "apikey",
        "secret",
        "client_secret",
        "password",
        "passwd",
        "pwd",
        "signature",
        "sig",
        "session",
        "sessionid",
        "credential",
        "credentials",
        "code",
    }
)
# ... and endings that make one (not "prompt_tokens": a count, which the API asks for)
_SECRET_ENDINGS = ("_token", "_key", "_secret", "_password")
# A registry token (tokens.py: a scope's prefix, then 32 random bytes in base64url).
_REGISTRY_TOKEN = re.compile(
    "(?:" + "|".join(map(re.escape, PREFIXES.values())) + ")[A-Za-z0-9_-]{16,}"
)
# A query string's name=value pair: after ? or &, up to the next & or the end of the target.
_PAIR = re.compile(r"(?<=[?&])([^=&#\s\"]*)=([^&#\s\"]*)")


def _is_secret(name: str, value: str) -> bool:
    name = unquote_plus(name).lower().replace("-", "_")
    return (
        name in _SECRET_NAMES
        or name.endswith(_SECRET_ENDINGS)
        or _REGISTRY_TOKEN.search(unquote_plus(value)) is not None
    )


def redact(text: str) -> str:
    """`text` with the value of each secret-looking query parameter replaced, and any
    registry token elsewhere in it."""
    if "?" in text:
        text = _PAIR.sub(
            lambda pair: f"{pair[1]}={REDACTED}" if _is_secret(pair[1], pair[2]) else pair[0],
            text,
        )
    return _REGISTRY_TOKEN.sub(REDACTED, text)


class RedactingFormatter(EscapingFormatter):
    """Each line escaped and its secrets redacted (an access log line's request target
    among them), the message formatted once."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = redact(record.message)
        return super().formatMessage(record)


def log_config() -> dict[str, Any]:
    """uvicorn's logging (its `log_config`) with each line escaped and secrets redacted,
    and the registry's own loggers (fleetbench.*) beside uvicorn's on stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "redacting": {
                "()": f"{__name__}.RedactingFormatter",
                "fmt": "%(levelname)s: %(message)s",
            },
        },
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "redacting",
                "stream": "ext://sys.stderr",
            },
            "access": {
                "class": "logging.StreamHandler",
                "formatter": "redacting",
                "stream": "ext://sys.stdout",
            },
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
            "fleetbench": {"handlers": ["default"], "level": "INFO", "propagate": False},
        },
    }


def uvicorn_options(settings: RegistrySettings, forwarded_allow_ips: str | None) -> dict[str, Any]:
    """uvicorn.run's options for these settings; `forwarded_allow_ips` (serve's option)
    stands for the setting when given."""
    trusted = forwarded_allow_ips or settings.forwarded_allow_ips
    return {
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted or "",
        "log_config": log_config(),
        "http": _http_protocol(),
        # h11's bound on a request's head, which BoundedHeadProtocol reads as its own
        "h11_max_incomplete_event_size": settings.max_header_bytes,
    }


def _http_protocol() -> type[asyncio.Protocol] | str:
    if importlib.util.find_spec("httptools") is None:
        return "h11"
    from fleetbench.registry.bounded_head import BoundedHeadProtocol

    return BoundedHeadProtocol
