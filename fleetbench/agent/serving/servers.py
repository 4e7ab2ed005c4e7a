"""Which server answers, read from the server itself: llama-server's /props (build, model
path, context) and /slots (how many, the context of each, which are busy); vLLM's /version;
Ollama's /api/version; otherwise an OpenAI-compatible server of unknown make. Whether it is
serving requests now: llama-server's /slots, else the requests in flight its Prometheus
/metrics count (llama-server's with --metrics, vLLM's)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from fleetbench.agent.bounded_http import AnswerTooLarge, read_bounded

__all__ = [
    "ServerInfo",
    "identify",
    "identify_at",
    "in_flight",
    "json_answer",
    "metrics_in_flight",
    "server_client",
]


@dataclass(frozen=True)
class ServerInfo:
    kind: str  # llama-server, vllm, ollama, openai-compatible
    build: str | None = None
    model_path: str | None = None
    n_ctx: int | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None


# The most of a server's answer read: /props with its chat template, /slots of hundreds of
# slots, /metrics, /tokenize's ids are kilobytes; past it the answer is no one's of these.
ANSWER_BYTES = 8 * 2**20


def json_answer(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    """The JSON of a 200 answer at `path`, or None for any answer that is not (another
    status, a redirect, which is never followed, more than ANSWER_BYTES); no answer at all
    raises httpx.TransportError (the server is not there)."""
    body = _body(client, method, path, **kwargs)
    try:
        return json.loads(body) if body is not None else None
    except ValueError:
        return None


def _body(client: httpx.Client, method: str, path: str, **kwargs: Any) -> bytes | None:
    with client.stream(method, path, **kwargs) as response:
        if response.status_code != 200:
            return None
        try:
            return read_bounded(response, ANSWER_BYTES)
        except AnswerTooLarge:
            return None


def identify(client: httpx.Client) -> ServerInfo:
    """What the server says of itself (anything it says that is not what it should be is
    not known). Raises httpx.TransportError when it does not answer."""
    props = json_answer(client, "GET", "/props")
    if isinstance(props, dict) and "build_info" in props:
        settings = props.get("default_generation_settings")
        n_ctx = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
        slots = json_answer(client, "GET", "/slots")
        per_slot = (
            [_count(s.get("n_ctx")) for s in slots if isinstance(s, dict)]
            if isinstance(slots, list)
            else []
        )
        return ServerInfo(
            kind="llama-server",
            build=str(props["build_info"]),
            model_path=_text(props.get("model_path")),
            n_ctx=n_ctx,
            slots=_count(props.get("total_slots")),
            ctx_per_slot=min((n for n in per_slot if n is not None), default=n_ctx),
        )
    version = json_answer(client, "GET", "/version")
    if isinstance(version, dict) and "version" in version:
        return ServerInfo(kind="vllm", build=str(version["version"]))
    ollama = json_answer(client, "GET", "/api/version")
    if isinstance(ollama, dict) and "version" in ollama:
        return ServerInfo(kind="ollama", build=str(ollama["version"]))
    return ServerInfo(kind="openai-compatible")


def server_client(url: str, timeout_s: float = 5.0) -> httpx.Client:
    """A client of the server at `url`: bounded waits, no redirect followed (a server must
    not send the agent elsewhere), and no proxy from the environment between the agent and
    a server on the node."""
    return httpx.Client(base_url=url, timeout=timeout_s, trust_env=False, follow_redirects=False)


def identify_at(url: str) -> ServerInfo | None:
    """What the server at `url` says of itself, or None when it does not answer."""
    with server_client(url) as client:
        try:
            return identify(client)
        except httpx.HTTPError:
            return None


def _count(value: Any) -> int | None:
    """A count the server gave, or None for anything that is not one."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# Prometheus gauges of the requests a server is processing now.
_IN_FLIGHT = ("llamacpp:requests_processing", "vllm:num_requests_running")


def in_flight(client: httpx.Client) -> int | None:
    """How many requests the server is processing now: llama-server's busy slots, else the
    gauges of its /metrics (None: it tells neither)."""
    slots = json_answer(client, "GET", "/slots")
    if isinstance(slots, list):
        return sum(1 for slot in slots if isinstance(slot, dict) and slot.get("is_processing"))
    metrics = _body(client, "GET", "/metrics")
    return metrics_in_flight(metrics.decode("utf-8", "replace")) if metrics is not None else None


def metrics_in_flight(text: str) -> int | None:
    """The requests in flight that Prometheus exposition `text` counts (summed over label
    sets, e.g. vLLM's per model), or None when it has none of the known gauges."""
    total: float | None = None
    for line in text.splitlines():
        name, _, rest = line.partition(" ") if "{" not in line else line.partition("{")
        if name not in _IN_FLIGHT:
            continue
        try:
            value = float(rest.rsplit("}", 1)[-1].split()[0])
        except (ValueError, IndexError):
            continue
        if 0 <= value < 2**31:  # not NaN, infinite or negative
            total = (total or 0.0) + value
    return round(total) if total is not None else None
