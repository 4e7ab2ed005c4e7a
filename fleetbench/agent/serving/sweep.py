"""A serving sweep: the server identified, prompts of the asked length made, then each
concurrency in turn through the closed loop, or, given an objective, the search for the
largest concurrency that meets it (serving.slo). Failure is data: a level whose every
request failed is a failure with the reason, and a server that stops answering fails the
levels left, while the points measured before are kept. Never a load test of a server
serving others: before each level its requests in flight are asked (servers.in_flight).
What else used this node while the levels ran is watched (agent.contention), the server's
process, where it runs here, counting as the run's own. After the levels, a llama-server's
output fingerprint is taken (serving.outputs), when no one else's requests are in flight.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from fleetbench.agent.contention import ContentionWatch
from fleetbench.agent.serving.dialects import dialect_for
from fleetbench.agent.serving.load import Limits, Load, Prompt, run_level
from fleetbench.agent.serving.outputs import NoFingerprint, server_fingerprint
from fleetbench.agent.serving.servers import (
    ServerInfo,
    identify,
    identify_at,
    in_flight,
    json_answer,
    server_client,
)
from fleetbench.agent.serving.slo import LevelFailed, SearchResult, search
from fleetbench.agent.serving.stats import describe_errors, serving_point
from fleetbench.contract.bounds import storable_text
from fleetbench.contract.outputs import OutputFingerprint
from fleetbench.contract.serve_spec import ServeSpec
from fleetbench.contract.wire import Contention, ServingPoint

__all__ = ["ServingOutcome", "serve_sweep"]

# Common words: random prompts of them tokenize to ordinary tokens, never special ones.
# fmt: off
_WORDS = (
    "time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part",
    "child", "eye", "woman", "place", "work", "week", "case", "point", "company", "number",
    "group", "problem", "fact", "river", "light", "window", "music", "garden", "market",
    "letter", "paper", "story", "water", "mountain", "engine", "table", "voice", "field",
)
# fmt: on


@dataclass
class ServingOutcome:
    server: ServerInfo
    prompt_exact: bool  # prompts counted by the server's tokenizer (else by words)
    points: list[ServingPoint] = field(default_factory=list)  # by concurrency
    failures: list[tuple[int, str]] = field(default_factory=list)  # (concurrency, why)
    warnings: list[str] = field(default_factory=list)
    search: SearchResult | None = None  # with an objective: what the search found
    # Nothing measured: the server was serving others' requests before the first level.
    postponed: str | None = None
    contention: Contention | None = None  # what else used this node while the levels ran
    outputs: OutputFingerprint | None = None  # the model's on the reference text, if taken


def _prompts(
    client: httpx.Client, prompt_tokens: int, server: ServerInfo, seed: int
) -> tuple[Callable[[], Prompt], bool]:
    """A maker of distinct prompts of `prompt_tokens` tokens: token ids drawn from a
    tokenized text where the server has llama-server's /tokenize (exact), else words."""
    rng = random.Random(seed)
    if server.kind == "llama-server":
        text = " ".join(rng.choice(_WORDS) for _ in range(200))  # a pool to draw ids from
        answer = json_answer(client, "POST", "/tokenize", json={"content": text})
        pool = answer.get("tokens") if isinstance(answer, dict) else None
        if isinstance(pool, list) and pool and all(isinstance(t, int) for t in pool):
            return lambda: rng.choices(pool, k=prompt_tokens), True
    return lambda: " ".join(rng.choice(_WORDS) for _ in range(prompt_tokens)), False


def _busy(url: str, *, patience_s: float) -> str | None:
    """Why the server is not to be measured now: it is serving requests of others. Asked
    every half second for `patience_s`: the server may still be finishing requests this
    sweep gave up on."""
    deadline = time.monotonic() + patience_s
    with server_client(url) as client:
        while True:
            try:
                busy = in_flight(client)
            except httpx.TransportError:
                return None  # the level finds out, and says so
            if not busy:
                return None
            if time.monotonic() > deadline:
                return f"not measured: the server is serving {busy} request(s) of others"
            time.sleep(0.5)


def _says_how_busy(url: str) -> bool:
    with server_client(url) as client:
        try:
            return in_flight(client) is not None
        except httpx.TransportError:
            return True  # the first level finds out, and says so


# A level whose requests all failed so: the server may be gone (asked, it says whether).
_GONE_ERRORS = {"refused", "timeout", "disconnected"}
# Errors that leave requests of this sweep behind on the server, still being served.
_ABANDONED_ERRORS = {"timeout", "stream cut off"}


@dataclass
class _Levels:
    """Measures one concurrency at a time against an identified server."""

    url: str
    model: str
    spec: ServeSpec
    outcome: ServingOutcome
    next_prompt: Callable[[], Prompt]
    patience_s: float
    on_point: Callable[[ServingPoint], None] | None
    current: int | None = None  # the level being measured
    warned_queue: bool = False

    def measure(self, concurrency: int) -> ServingPoint | LevelFailed:
        self.current = concurrency
        server, spec = self.outcome.server, self.spec
        if (busy := _busy(self.url, patience_s=self.patience_s)) is not None:
            return LevelFailed(busy, final=True)  # never load-test a server in use
        if server.slots is not None and concurrency > server.slots and not self.warned_queue:
            self.warned_queue = True
            self.outcome.warnings.append(
                f"concurrency {concurrency} and above exceed the server's {server.slots} "
                "slots: requests queue, and their TTFT includes the wait"
            )
        records, started, ended = asyncio.run(
            run_level(
                self.url,
                dialect_for(server.kind),
                self.next_prompt,
                concurrency=concurrency,
                load=Load(spec.requests, spec.duration_s),
                gen_tokens=spec.gen_tokens,
                model=self.model,
                limits=Limits(
                    first_token_s=spec.first_token_timeout_s, request_s=spec.request_timeout_s
                ),
            )
        )
        point = serving_point(concurrency, records, started=started, ended=ended)
        if set(point.errors) & _ABANDONED_ERRORS:
            # Requests given up on may still be served: the next level waits for them
            # before it takes the server for busy with others' requests.
            self.patience_s = max(self.patience_s, min(spec.request_timeout_s, 600.0))
        if not point.completed:
            # refused, or not answering even what it is: every level after this fails too
            gone = set(point.errors) <= _GONE_ERRORS and identify_at(self.url) is None
            return LevelFailed(f"every request failed: {describe_errors(point.errors)}", gone)
        if self.on_point is not None:
            self.on_point(point)
        return point

    def record(self, concurrency: int, result: ServingPoint | LevelFailed) -> None:
        if isinstance(result, LevelFailed):
            self.outcome.failures.append((concurrency, result.reason))
        else:
            self.outcome.points.append(result)


def serve_sweep(
    url: str,
    model: str,
    spec: ServeSpec,
    *,
    on_point: Callable[[ServingPoint], None] | None = None,
    busy_patience_s: float = 5.0,
    seed: int = 0,
) -> ServingOutcome:
    """Measures the server at `url` (serving `model`, as reports and OpenAI-compatible
    servers name it) at each of the spec's concurrencies, or searches for the largest that
    meets its objective (see the module). Never raises: what went wrong is in the outcome."""
    planned = (1,) if spec.slo is not None else spec.concurrency  # a search starts at 1
    with server_client(url) as client:
        try:
            server = identify(client)
            next_prompt, exact = _prompts(client, spec.prompt_tokens, server, seed)
        except httpx.HTTPError as exc:
            outcome = ServingOutcome(ServerInfo(kind="unreachable"), prompt_exact=False)
            reason = f"the server at {url} did not answer: {exc}"
            outcome.failures = [(c, reason) for c in planned]
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
    if not _says_how_busy(url):
        outcome.warnings.append(
            "the server does not say how many requests it is processing (no /slots, no "
            "/metrics gauge): whether it serves others' requests meanwhile is not known"
        )
    if (busy := _busy(url, patience_s=busy_patience_s)) is not None:
        outcome.postponed = busy
        return outcome
    levels = _Levels(url, model, spec, outcome, next_prompt, busy_patience_s, on_point)
    watch = ContentionWatch(server_url=url)
    try:
        with watch:
            _measure_all(levels, planned)
    except Exception as exc:  # an answer no rule foresaw: the sweep's end, never the agent's
        why = storable_text(f"the sweep stopped: {type(exc).__name__}: {exc}", 500)
        done = {p.concurrency for p in outcome.points} | {c for c, _ in outcome.failures}
        left = [c for c in (levels.current, *planned) if c is not None and c not in done]
        outcome.failures.extend((c, why) for c in dict.fromkeys(left))
        if (objective := spec.objective()) is not None:
            met = [
                p.concurrency for p in outcome.points if not p.errors and not objective.misses(p)
            ]
            outcome.search = SearchResult(str(objective), max(met, default=None), why)
    outcome.contention = watch.figures()
    outcome.points.sort(key=lambda p: p.concurrency)
    if spec.outputs and server.kind == "llama-server" and outcome.points:
        _take_outputs(url, outcome, patience_s=levels.patience_s)
    return outcome


def _take_outputs(url: str, outcome: ServingOutcome, *, patience_s: float) -> None:
    """The server's output fingerprint, after the levels and never while it serves others'
    requests (theirs would share its batches); why not, where it was not taken."""
    if (busy := _busy(url, patience_s=patience_s)) is not None:
        outcome.warnings.append(f"no output fingerprint: {busy}")
        return
    with server_client(url) as client:
        try:
            outcome.outputs = server_fingerprint(client, shared=True)
        except (NoFingerprint, httpx.HTTPError) as exc:
            outcome.warnings.append(f"no output fingerprint: {exc}")
        except Exception as exc:  # an answer no rule foresaw: the points stand without it
            why = storable_text(f"{type(exc).__name__}: {exc}", 500)
            outcome.warnings.append(f"no output fingerprint: {why}")


def _measure_all(levels: _Levels, planned: Sequence[int]) -> None:
    """The spec's concurrencies in turn, or its objective's search."""
    spec, outcome = levels.spec, levels.outcome
    objective = spec.objective()
    if objective is not None:
        outcome.search = search(
            levels.measure,
            objective,
            max_concurrency=spec.max_concurrency,
            budget_s=spec.search_budget_s,
            record=levels.record,
        )
        return
    for index, concurrency in enumerate(planned):
        result = levels.measure(concurrency)
        levels.record(concurrency, result)
        if isinstance(result, LevelFailed) and result.final:
            gone = f"not measured: the server at {levels.url} stopped answering"
            why = result.reason if result.reason.startswith("not measured") else gone
            outcome.failures.extend((c, why) for c in planned[index + 1 :])
            return
