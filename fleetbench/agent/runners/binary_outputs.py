"""A binary sweep's output fingerprint (contract.outputs): llama-batched-bench prints no
logits, so the llama-server of its build folder is started once the points are done, on a
loopback port with the sweep's model and the settings that change what a model outputs
(offload, flash attention, the KV cache's types), asked for the fingerprint
(serving.outputs) and stopped. Where there is no llama-server beside the binary, or it is of
another build, the run has none, and the reason is said.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx

from fleetbench.agent import _proc
from fleetbench.agent.batched_bench_build import parse_build
from fleetbench.agent.serving.outputs import NoFingerprint, server_fingerprint
from fleetbench.agent.serving.servers import identify_at, server_client
from fleetbench.contract.build_label import build_label
from fleetbench.contract.outputs import MOST_POSITIONS, OutputFingerprint
from fleetbench.contract.sweep_spec import SweepSpec
from fleetbench.contract.wire import EngineBuild

__all__ = ["SERVER", "binary_fingerprint"]

SERVER = "llama-server"
_LOAD_S = 600.0  # the model's load: a large one from a slow disk takes minutes


def binary_fingerprint(
    binary: Path, model: Path, spec: SweepSpec, engine: EngineBuild
) -> OutputFingerprint:
    """The fingerprint of `model` through the llama-server beside `binary` (of `engine`'s
    build); raises NoFingerprint with the reason where it cannot be taken."""
    server = binary.with_name(SERVER)
    if not server.is_file():
        raise NoFingerprint(f"no {SERVER} beside {binary} to take it with")
    if engine.build_number is None and engine.commit is None:
        raise NoFingerprint(
            f"the build of {binary} is not known (built without git?): whether the "
            f"{SERVER} beside it is of the same build cannot be told"
        )
    build = parse_build(_said(server, "--version"))
    if (build.build_number, build.commit) != (engine.build_number, engine.commit):
        raise NoFingerprint(
            f"{server} is {build_label(build)}, the sweep's binary {build_label(engine)}: "
            "another build's outputs are not the sweep's"
        )
    port = _free_port()
    argv = [
        str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-c", str(MOST_POSITIONS), "-np", "1", "-ngl", str(spec.n_gpu_layers),
        "-fa", spec.flash_attn, "-ctk", spec.cache_type_k, "-ctv", spec.cache_type_v,
    ]  # fmt: skip
    if spec.n_threads is not None:
        argv += ["-t", str(spec.n_threads)]
    if "--swa-full" in _said(server, "--help"):
        # a sliding-window model's cache kept whole: each position then costs one token's
        # decode, where a cache of the window alone has the server decode a few again
        argv.append("--swa-full")
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, process, log)
            said = identify_at(url)
            if said is None or said.model_path != str(model):
                # the port was taken between choosing it and the server binding it
                raise NoFingerprint(f"another server answered on port {port}")
            with server_client(url) as client:
                try:
                    return server_fingerprint(client)
                except httpx.HTTPError as exc:
                    raise NoFingerprint(f"{SERVER} stopped answering: {exc}") from None
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _said(server: Path, option: str) -> str:
    """What `server option` prints (older builds print their version, then exit 1)."""
    try:
        return _proc.run([str(server), option], timeout=30, with_stderr=True)
    except _proc.CommandFailed as exc:
        return exc.output
    except _proc.CommandNotFound as exc:
        raise NoFingerprint(f"{server} did not run: {exc}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: IO[str]) -> None:
    """Until the server's /health answers 200 (its model loaded); raises NoFingerprint
    with its last words where it exits first, or takes longer than _LOAD_S."""
    deadline = time.monotonic() + _LOAD_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            lines = [line for line in log.read().splitlines() if line.strip()]
            raise NoFingerprint(
                f"{SERVER} exited with status {process.returncode}: "
                f"{lines[-1] if lines else 'no message'}"
            )
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise NoFingerprint(f"{SERVER} did not load the model in {_LOAD_S:.0f} s")
