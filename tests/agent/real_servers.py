"""Real servers for serving sweeps, started on loopback ports and stopped afterwards:
llama-server (built from the llama.cpp llama-cpp-python vendors) and llama-cpp-python's own
OpenAI-compatible server, a second implementation of the protocol."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.factories import free_port

__all__ = ["llama_cpp_python_server", "llama_server"]

# One engine thread: llama.cpp's threads wait for each other at every step, spinning, so
# two of them on cores other test workers also want slow decoding down many times over (8
# tokens took seconds); one thread shares a core smoothly. Alone, two were no faster here
# (the llama-server sweep marked alone: 61 s against 37 s).
ENGINE_THREADS = "1"


@contextmanager
def _serving(
    command: list[str], log: Path, ready: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Starts `command` (its {port} filled in), waits until GET `ready` answers 200."""
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(
            [part.replace("{port}", str(port)) for part in command],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                if httpx.get(url + ready, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def llama_server(
    binary: Path,
    model: Path,
    log: Path,
    *,
    slots: int,
    ctx_per_slot: int,
    extra: tuple[str, ...] = (),
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """llama-server with `slots` slots of `ctx_per_slot` tokens, one thread (ENGINE_THREADS)."""
    command = [
        str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
        "-np", str(slots), "-c", str(ctx_per_slot * slots), "-t", ENGINE_THREADS, "--no-webui",
        *extra,
    ]  # fmt: skip
    with _serving(command, log, "/health") as running:
        yield running


@contextmanager
def llama_cpp_python_server(
    model: Path, log: Path, *, interrupt: bool
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """llama-cpp-python's server (`python -m llama_cpp.server`): one request at a time; with
    `interrupt` (its default) a new request cuts the one streaming short."""
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
        "--port", "{port}", "--n_ctx", "2048", "--n_threads", ENGINE_THREADS,
        "--interrupt_requests", str(interrupt),
    ]  # fmt: skip
    with _serving(command, log, "/v1/models") as running:
        yield running
