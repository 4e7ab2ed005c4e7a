"""A serving sweep: the server identified, prompts of the asked length made, then each
concurrency in turn through the closed loop. Failure is data: a level whose every request
failed is a failure with the reason, and a server that stops answering fails the levels
left, while the points measured before are kept."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from fleetbench.agent.serving.dialects import dialect_for
from fleetbench.agent.serving.load import Limits, Prompt, run_level
from fleetbench.agent.serving.servers import ServerInfo, busy_slots, identify
from fleetbench.agent.serving.stats import ServingPoint, serving_point

__all__ = ["ServeSpec", "ServingOutcome", "serve_sweep"]

# Common words: random prompts of them tokenize to ordinary tokens, never special ones.
# fmt: off
_WORDS = (
    "time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part",
    "child", "eye", "woman", "place", "work", "week", "case", "point", "company", "number",
    "group", "problem", "fact", "river", "light", "window", "music", "garden", "market",
    "letter", "paper", "story", "water", "mountain", "engine", "table", "voice", "field",
)
# fmt: on


@dataclass(frozen=True)
class ServeSpec:
    url: str
    model: str  # what reports call it, and what OpenAI-compatible servers are asked for
    concurrency: Sequence[int] = (1, 2, 4, 8)
    prompt_tokens: int = 512
    gen_tokens: int = 128
    requests: int | None = None  # per level; default: 4 per stream, at least 8
    limits: Limits = field(default_factory=Limits)
    seed: int = 0


@dataclass
class ServingOutcome:
    server: ServerInfo
    prompt_exact: bool  # prompts counted by the server's tokenizer (else by words)
    points: list[ServingPoint] = field(default_factory=list)
    failures: list[tuple[int, str]] = field(default_factory=list)  # (concurrency, why)
    warnings: list[str] = field(default_factory=list)


def _prompts(
    client: httpx.Client, spec: ServeSpec, server: ServerInfo
) -> tuple[Callable[[], Prompt], bool]:
    """A maker of distinct prompts of `prompt_tokens` tokens: token ids drawn from a
    tokenized text where the server has llama-server's /tokenize (exact), else words."""
    rng = random.Random(spec.seed)
    if server.kind == "llama-server":
        text = " ".join(rng.choice(_WORDS) for _ in range(200))  # a pool to draw ids from
        answer = client.post("/tokenize", json={"content": text})
        try:
            pool = answer.json().get("tokens") if answer.status_code == 200 else None
        except (ValueError, AttributeError):
            pool = None
        if isinstance(pool, list) and pool and all(isinstance(t, int) for t in pool):
            return lambda: rng.choices(pool, k=spec.prompt_tokens), True
    return lambda: " ".join(rng.choice(_WORDS) for _ in range(spec.prompt_tokens)), False


def _busy(url: str, *, patience_s: float = 5.0) -> str | None:
    """Why the server is not to be measured now: it is serving requests of others. Asked a
    few times over `patience_s`: the server may still be finishing requests this sweep gave
    up on."""
    deadline = time.monotonic() + patience_s
    with httpx.Client(base_url=url, timeout=5, trust_env=False) as client:
        while True:
            try:
                busy = busy_slots(client)
            except httpx.TransportError:
                return None  # the level finds out, and says so
            if not busy:
                return None
            if time.monotonic() > deadline:
                return f"not measured: the server is serving {busy} request(s) of others"
            time.sleep(0.5)


def serve_sweep(
    spec: ServeSpec, *, on_point: Callable[[ServingPoint], None] | None = None
) -> ServingOutcome:
    """Measures the server at `spec.url` at each concurrency (see the module)."""
    with httpx.Client(base_url=spec.url, timeout=spec.limits.connect_s, trust_env=False) as client:
        try:
            server = identify(client)
            next_prompt, exact = _prompts(client, spec, server)
        except httpx.HTTPError as exc:
            outcome = ServingOutcome(ServerInfo(kind="unreachable"), prompt_exact=False)
            reason = f"the server at {spec.url} did not answer: {exc}"
            outcome.failures = [(c, reason) for c in spec.concurrency]
            return outcome
    outcome = ServingOutcome(server, exact)
    needed = spec.prompt_tokens + spec.gen_tokens
    if server.ctx_per_slot is not None and server.ctx_per_slot < needed:
        outcome.warnings.append(
            f"each slot holds {server.ctx_per_slot} tokens, less than prompt + output ({needed})"
        )
    if not exact:
        outcome.warnings.append(
            "prompt lengths are approximate: the server has no tokenizer endpoint"
        )
    dialect = dialect_for(server.kind)
    for index, concurrency in enumerate(spec.concurrency):
        if (busy := _busy(spec.url)) is not None:  # never load-test a server in use
            outcome.failures.extend((c, busy) for c in spec.concurrency[index:])
            break
        if server.slots is not None and concurrency > server.slots:
            outcome.warnings.append(
                f"concurrency {concurrency} exceeds the server's {server.slots} slots: requests "
                "queue, and their TTFT includes the wait"
            )
        requests = spec.requests or max(8, 4 * concurrency)
        records, started, ended = asyncio.run(
            run_level(
                spec.url,
                dialect,
                next_prompt,
                concurrency=concurrency,
                requests=requests,
                gen_tokens=spec.gen_tokens,
                model=spec.model,
                limits=spec.limits,
            )
        )
        point = serving_point(concurrency, records, started=started, ended=ended)
        if point.completed:
            outcome.points.append(point)
            if on_point is not None:
                on_point(point)
            continue
        why = ", ".join(f"{count} {kind}" for kind, count in point.errors.items())
        outcome.failures.append((concurrency, f"every request failed: {why}"))
        if set(point.errors) <= {"refused", "timeout"}:  # gone, or hung: the rest fail too
            gone = f"not measured: the server at {spec.url} stopped answering"
            outcome.failures.extend((c, gone) for c in spec.concurrency[index + 1 :])
            break
    return outcome
