"""How a streaming completion is asked for and read, per kind of server: llama-server's own
/completion (exact token-id prompts, `n_predict` + `ignore_eos`, `cache_prompt: false`) and
the OpenAI-compatible /v1/completions (`max_tokens` + `ignore_eos`/`min_tokens`, which
vLLM and llama-server honour, and the usage the stream ends with)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["LLAMA_SERVER", "OPENAI", "Dialect", "Event", "dialect_for"]


@dataclass(frozen=True)
class Event:
    """One streamed event: whether it carries output, the tokens generated so far when the
    server says (a running count: an event may carry several tokens, or none that show,
    such as a UTF-8 character's first bytes), whether it ends the stream, and the server's
    error, if it reports one in the stream."""

    text: bool
    count: int | None = None
    done: bool = False
    error: str | None = None


class Dialect(Protocol):
    name: str
    path: str

    def body(self, prompt: list[int] | str, gen_tokens: int, model: str) -> dict[str, Any]: ...

    def read(self, data: str) -> Event:
        """The event an SSE `data:` line holds."""
        ...


class _Stream:
    """What every dialect's stream shares: JSON object events, an error event ends it."""

    end: str | None = None  # a data line that ends the stream without being JSON

    def read(self, data: str) -> Event:
        if self.end is not None and data.strip() == self.end:
            return Event(False, done=True)
        event = json.loads(data)
        if not isinstance(event, dict):
            raise ValueError(f"an event that is not a JSON object: {data[:100]!r}")
        if "error" in event:
            return Event(False, done=True, error=str(event["error"]))
        text, count, done = self._fields(event)
        return Event(text, count if isinstance(count, int) else None, done=done)

    def _fields(self, event: dict[str, Any]) -> tuple[bool, object, bool]:
        """(carries output, the running token count or None, ends the stream)."""
        raise NotImplementedError


class _LlamaServer(_Stream):
    name = "llama-server"
    path = "/completion"

    def body(self, prompt: list[int] | str, gen_tokens: int, model: str) -> dict[str, Any]:
        return {
            "prompt": prompt,
            "n_predict": gen_tokens,
            "ignore_eos": True,
            "cache_prompt": False,  # distinct prompts too: no prefix is reused
            "stream": True,
            "temperature": 0,
        }

    def _fields(self, event: dict[str, Any]) -> tuple[bool, object, bool]:
        return bool(event.get("content")), event.get("tokens_predicted"), bool(event.get("stop"))


class _OpenAI(_Stream):
    name = "openai"
    path = "/v1/completions"
    end = "[DONE]"

    def body(self, prompt: list[int] | str, gen_tokens: int, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": gen_tokens,
            "min_tokens": gen_tokens,
            "ignore_eos": True,
            "stream": True,
            # the running count in every chunk where the server gives it (vLLM)
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "temperature": 0,
        }

    def _fields(self, event: dict[str, Any]) -> tuple[bool, object, bool]:
        usage = event.get("usage")
        count = usage.get("completion_tokens") if isinstance(usage, dict) else None
        choices = event.get("choices")
        text = isinstance(choices, list) and bool(choices) and bool(choices[0].get("text"))
        return text, count, False


LLAMA_SERVER: Dialect = _LlamaServer()
OPENAI: Dialect = _OpenAI()


def dialect_for(kind: str) -> Dialect:
    """llama-server's own protocol for a llama-server, the OpenAI one for any other."""
    return LLAMA_SERVER if kind == "llama-server" else OPENAI
