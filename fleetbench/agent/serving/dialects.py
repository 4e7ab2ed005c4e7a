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
    """One streamed event: tokens it carries, whether it ends the stream, and the output
    length the server reports (at the end, when it does)."""

    tokens: int
    done: bool
    reported: int | None = None


class Dialect(Protocol):
    name: str
    path: str

    def body(self, prompt: list[int] | str, gen_tokens: int, model: str) -> dict[str, Any]: ...

    def read(self, data: str) -> Event:
        """The event an SSE `data:` line holds."""
        ...


class _LlamaServer:
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

    def read(self, data: str) -> Event:
        event = json.loads(data)
        if event.get("stop"):
            predicted = event.get("tokens_predicted")
            # the last event may carry the last token's text as well
            return Event(1 if event.get("content") else 0, True, predicted)
        return Event(1, False)


class _OpenAI:
    name = "openai"
    path = "/v1/completions"

    def body(self, prompt: list[int] | str, gen_tokens: int, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": gen_tokens,
            "min_tokens": gen_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }

    def read(self, data: str) -> Event:
        if data.strip() == "[DONE]":
            return Event(0, True)
        event = json.loads(data)
        usage = event.get("usage") or {}
        choices = event.get("choices") or []
        text = choices[0].get("text") if choices else None
        if not choices and usage:
            return Event(0, False, usage.get("completion_tokens"))
        return Event(1 if text else 0, False, usage.get("completion_tokens"))


LLAMA_SERVER: Dialect = _LlamaServer()
OPENAI: Dialect = _OpenAI()


def dialect_for(kind: str) -> Dialect:
    """llama-server's own protocol for a llama-server, the OpenAI one for any other."""
    return LLAMA_SERVER if kind == "llama-server" else OPENAI
