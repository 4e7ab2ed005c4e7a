"""What tests build their cases with: the article's curve and model, valid reports, a
live registry on loopback, the agent's CLI in a fresh process. Fixtures are in conftest.py;
these are plain functions and classes, imported by name."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from fleetbench.agent.config import AgentSettings
from fleetbench.agent.daemon import Daemon, DaemonConfig, ServeSweepConfig, SweepConfig
from fleetbench.contract import wire
from fleetbench.registry import tokens
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import (
    create_db_engine,
    session_factory,
    write_transaction,
)
from fleetbench.registry.ingest import Stored, ingest_batch
from fleetbench.registry.main import create_app
from fleetbench.registry.regressions.judge import judge_due

FIXTURES = Path(__file__).parent / "fixtures"


class LiveRegistry:
    """A registry served by uvicorn on a loopback port, and what tests need around it."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url
        self.engine = engine

    def token(self, node: str, **labels: str) -> str:
        """A new node token's secret (the node made if new, with these labels)."""
        with session_factory(self.engine)() as session, write_transaction(session):
            token = tokens.create_node_token(session, node_name=node, labels=labels)
            session.commit()
        return token

    def scoped_token(
        self, scope: tokens.Scope, name: str | None = None, expires_at: datetime | None = None
    ) -> str:
        """A new reader or admin token's secret."""
        with session_factory(self.engine)() as session, write_transaction(session):
            _, secret = tokens.create_token(session, scope=scope, name=name, expires_at=expires_at)
            session.commit()
        return secret

    def client(self, token: str | None = None) -> httpx.Client:
        """A client of the registry; a report it posts is answered once the registry's
        judge has judged its series (running_registry judges at once), so a test reads
        the regressions the report makes, as a user would a moment later."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}

        def judged_after_a_report(response: httpx.Response) -> None:
            request = response.request
            if (request.method, request.url.path) == ("POST", "/v1/runs") and response.is_success:
                self.judged()

        return httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=30,
            event_hooks={"response": [judged_after_a_report]},
            # plain HTTP on loopback: no certificates to load, which costs ~40 ms a client here
            verify=False,
        )

    def count(self, table: str) -> int:
        with self.engine.connect() as connection:
            return int(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())

    def judged(self, seconds: float = 20) -> None:
        """Waits until the registry's judge has judged every series check queued."""
        deadline = time.monotonic() + seconds
        while self.count("series_checks"):
            assert time.monotonic() < deadline, "the registry's judge left checks queued"
            time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PromptServer(uvicorn.Server):
    """uvicorn's server, looking for its stop every 5 ms rather than every 100 ms: a
    test's registry stops in 0.1 s instead of 0.18 s, and the suite stops hundreds."""

    async def main_loop(self) -> None:
        ticks = 0
        # on_tick(0) also renews the Date header: once a second, as uvicorn's loop does
        while not await self.on_tick(0 if ticks % 200 == 0 else 1):
            ticks += 1
            await asyncio.sleep(0.005)


def serve_in_thread(settings: RegistrySettings) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = free_port()
    server = _PromptServer(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("registry did not start")
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


@contextmanager
def running_registry(settings: RegistrySettings) -> Iterator[LiveRegistry]:
    """A registry with these settings served on loopback for the duration; unless they
    say otherwise, its judge judges a series as soon as it is queued."""
    if "regression_check_delay_s" not in settings.model_fields_set:
        settings = settings.model_copy(update={"regression_check_delay_s": 0})
    url, server, thread = serve_in_thread(settings)
    engine = create_db_engine(settings.sqlalchemy_url)
    try:
        yield LiveRegistry(url, engine)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


ARTICLE_TABLE = [  # Apple M4 Pro, Mistral-Nemo-Instruct-2407-Q4_K_M, llama.cpp build 11429
    # (B, S_PP, S_TG) at PP=512, TG=128
    (1, 282.07, 28.30),
    (2, 275.77, 42.14),
    (4, 281.35, 69.64),
    (8, 285.83, 133.65),
    (16, 284.82, 163.18),
    (32, 286.06, 193.55),
]
ARTICLE_MODEL = "Mistral-Nemo-Instruct-2407-Q4_K_M"
# Its architecture, as the article gives it: 40 layers, 8 KV heads of 128, f16 cache.
ARTICLE_MODEL_INFO = wire.ModelInfo(
    name=ARTICLE_MODEL,
    n_layer=40,
    n_head_kv=8,
    head_dim_k=128,
    head_dim_v=128,
    file_size=7_477_207_552,
)


def make_report(
    *,
    node: str = "m4pro",
    model: str | wire.ModelInfo = ARTICLE_MODEL,
    table: list[tuple[int, float, float]] | None = None,
    pp: int = 512,
    tg: int = 128,
    started_at: datetime | None = None,
    build_number: int | None = 11429,
    **overrides: Any,
) -> wire.RunReport:
    """A valid report with the article's curve unless told otherwise."""
    points = [
        wire.Point(pp=pp, tg=tg, b=b, n_kv=b * (pp + tg), s_pp=s_pp, s_tg=s_tg)
        for b, s_pp, s_tg in (table or ARTICLE_TABLE)
    ]
    fields: dict[str, Any] = {
        "schema_version": wire.SCHEMA_VERSION,
        "run_id": uuid.uuid4(),
        "node": node,
        "started_at": started_at or datetime(2026, 10, 16, 12, 0, tzinfo=UTC),
        "engine": wire.EngineBuild(build_number=build_number, backend="Metal"),
        "model": model if isinstance(model, wire.ModelInfo) else wire.ModelInfo(name=model),
        "points": points,
    }
    fields.update(overrides)
    return wire.RunReport(**fields)


def make_serving_report(
    *,
    node: str,
    model: str = "gemma-3-270m",
    points: list[tuple[int, float, float, float]],
    started_at: datetime | None = None,
    build_number: int = 7100,
    slots: int | None = 4,
    ctx_per_slot: int | None = 4096,
    prompt_tokens: int = 512,
    gen_tokens: int = 128,
    errors: dict[int, dict[str, int]] | None = None,
    **overrides: Any,
) -> wire.RunReport:
    """A serving run of llama-server: `points` are (C, total output t/s, p10 per-user t/s,
    TTFT p90 ms); `errors` by C."""
    serving = []
    for concurrency, total, p10, ttft in points:
        failed = (errors or {}).get(concurrency, {})
        requests = 4 * concurrency
        serving.append(
            wire.ServingPoint(
                concurrency=concurrency,
                requests=requests,
                completed=requests - sum(failed.values()),
                output_tokens=(requests - sum(failed.values())) * gen_tokens,
                seconds=requests * gen_tokens / total,
                total_tps=total,
                per_user_tps_p10=p10,
                per_user_tps_p50=p10 * 1.1,
                ttft_ms_p50=ttft * 0.8,
                ttft_ms_p90=ttft,
                errors=failed,
            )
        )
    fields: dict[str, Any] = {
        "schema_version": wire.SCHEMA_VERSION,
        "run_id": uuid.uuid4(),
        "node": node,
        "started_at": started_at or datetime(2026, 10, 17, 12, 0, tzinfo=UTC),
        "engine": wire.EngineBuild(
            build_number=build_number, commit="0c1e570", binding="llama-server"
        ),
        "model": wire.ModelInfo(name=model),
        "kind": "serving",
        "server": wire.ServerIdentity(
            kind="llama-server",
            build=f"b{build_number}-0c1e570",
            slots=slots,
            ctx_per_slot=ctx_per_slot,
            prompt_tokens=prompt_tokens,
            gen_tokens=gen_tokens,
            prompt_exact=True,
        ),
        "serving_points": serving,
    }
    fields.update(overrides)
    return wire.RunReport(**fields)


JSON = {"content-type": "application/json"}


def store_report(session: Session, report: wire.RunReport, node_id: int) -> Stored:
    """Stores the report as a run of the node straight through the storage layer (one
    batch, committed) and judges the series it joins, as a registry's judge would."""
    with write_transaction(session):
        [stored] = ingest_batch(session, [(report, node_id)])
        if isinstance(stored, Exception):
            raise stored
        session.commit()
    bind = session.get_bind()
    assert isinstance(bind, Engine)
    judge_due(session_factory(bind))
    return stored


def post_report(client: httpx.Client, report: wire.RunReport | dict[str, Any]) -> httpx.Response:
    body = report.model_dump_json() if isinstance(report, wire.RunReport) else _json(report)
    return client.post("/v1/runs", content=body, headers=JSON)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, default=str)


class _StateFolders:
    """Folders for the agents' spools, removed when the test session ends."""

    def __init__(self) -> None:
        self._root: tempfile.TemporaryDirectory[str] | None = None

    def mkdtemp(self) -> str:
        if self._root is None:
            self._root = tempfile.TemporaryDirectory(prefix="fleetbench-agent-state-")
            atexit.register(self._root.cleanup)
        return tempfile.mkdtemp(dir=self._root.name)


_AGENT_STATE = _StateFolders()


def agent(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`fleetbench-agent ARGS` in a fresh process (see `command`)."""
    return command(sys.executable, "-m", "fleetbench.agent.cli", *args, **env)


def registry_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`fleetbench-registry ARGS` in a fresh process (see `command`)."""
    return command(sys.executable, "-m", "fleetbench.registry.cli", *args, **env)


def command(
    *argv: str | Path, cwd: Path | None = None, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """A command in a fresh process, with only the FLEETBENCH_* variables given (and the
    suite's contention thresholds: its sweeps run beside parallel tests), its output
    read in a pipe (no terminal, no COLUMNS), as a script or a log reads it; an agent's spool
    in a folder of its own unless `env` names one (XDG_STATE_HOME or FLEETBENCH_SPOOL)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if (not k.startswith("FLEETBENCH_") or k.startswith("FLEETBENCH_CONTENTION_"))
        and k != "COLUMNS"
    }
    if "XDG_STATE_HOME" not in env and "FLEETBENCH_SPOOL" not in env:
        clean["XDG_STATE_HOME"] = _AGENT_STATE.mkdtemp()
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until_serving(
    url: str,
    server: subprocess.Popen[Any],
    *,
    seconds: float = 60,
    log: Path | None = None,
    verify: ssl.SSLContext | bool = True,
) -> httpx.Response:
    """The first answer of the registry process `server` at `url` to /healthz; fails the
    test (with the end of `log`) if the process dies or `seconds` pass first."""
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=1, verify=verify) as http:  # one client: ~40 ms each here
        while True:
            try:
                return http.get(f"{url}/healthz")
            except httpx.TransportError:
                pass
            said = log.read_text()[-3000:] if log is not None else ""
            assert server.poll() is None, f"the registry exited: {said}"
            assert time.monotonic() < deadline, f"the registry did not answer: {said}"
            time.sleep(0.1)


# A node's history: one run a day from DAY0, the article's curve scaled by a factor.
DAY0 = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)
# Run-to-run wobble of a quiet node, the same for every B: under 2%.
WOBBLE = [1.0, 1.012, 0.991, 1.006, 0.995, 1.009, 0.988, 1.003]


def scaled(factor: float) -> list[tuple[int, float, float]]:
    return [(b, s_pp * factor, s_tg * factor) for b, s_pp, s_tg in ARTICLE_TABLE]


def post_history(
    registry: LiveRegistry,
    runs: list[tuple[int, float]],
    start: datetime = DAY0,
    **report: Any,
) -> None:
    """One run per (build number, speed factor), a day apart from `start`."""
    token = registry.token("m4pro")
    with registry.client(token) as client:
        for day, (build, factor) in enumerate(runs):
            sent = make_report(
                table=scaled(factor),
                build_number=build,
                started_at=start + timedelta(days=day),
                **report,
            )
            assert post_report(client, sent).status_code == 201


def a_daemon(
    tmp_path: Path,
    *sweeps: SweepConfig | ServeSweepConfig | dict[str, Any],
    load: tuple[float, float | None] = (5.0, None),
    **settings: Any,
) -> Daemon:
    """A daemon of node ci-node with its spool and caches under `tmp_path`, running
    `sweeps` with these settings, on a machine as busy as `load` (CPU %, GPU %) says."""
    config = DaemonConfig(
        AgentSettings(
            **{
                "node": "ci-node",
                "spool": tmp_path / "state" / "spool.db",
                "cache_dir": tmp_path / "cache",
                **settings,
            }
        ),
        [SweepConfig.model_validate(s) if isinstance(s, dict) else s for s in sweeps],
    )
    return Daemon(config, load=lambda: load)


class Receiver:
    """Answers each POST with the next status in `statuses` (then 200) and keeps the bodies;
    `meanwhile` runs before each answer (what another process does during a delivery)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.bodies: list[dict[str, Any]] = []
        self.attempts = 0
        self.meanwhile: Callable[[], None] | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = json.loads(self.rfile.read(length))
                receiver.attempts += 1
                if receiver.meanwhile is not None:
                    receiver.meanwhile()
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    receiver.bodies.append(body)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while len(self.bodies) < count:
            assert time.monotonic() < deadline, f"{len(self.bodies)} of {count} webhooks arrived"
            time.sleep(0.05)
