"""`fleetbench-registry serve` as an operator runs it, a real process on loopback: whose
X-Forwarded-For it believes, what its logs keep of a request, and how large a request's head
it reads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.factories import free_port, wait_until_serving

REGISTRY = [sys.executable, "-m", "fleetbench.registry.cli"]
REFUSALS = 5  # refused tokens a minute one client address may send before a 429


@dataclass
class Served:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path  # its stdout and stderr

    def stop(self) -> str:
        """Stops the registry; returns its log, all of it written."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        return self.log.read_text(encoding="utf-8")


@contextmanager
def serving(
    tmp_path: Path, migrated_sqlite_file: Path, *options: str, **settings: str
) -> Iterator[Served]:
    """`serve` with these options and FLEETBENCH_* settings, on a copy of a migrated
    SQLite file."""
    database = tmp_path / "registry.db"
    shutil.copy(migrated_sqlite_file, database)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_")}
    env.update(
        PYTHONUNBUFFERED="1",
        FLEETBENCH_DATABASE_URL=f"sqlite:///{database}",
        FLEETBENCH_AUTH_FAILURES_PER_MINUTE=str(REFUSALS),
        **{f"FLEETBENCH_{name.upper()}": value for name, value in settings.items()},
    )
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*REGISTRY, "serve", "--port", str(port), *options],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    served = Served(f"http://127.0.0.1:{port}", port, process, log)
    try:
        wait_until_serving(served.url, process, log=log)
        yield served
    finally:
        served.stop()


def refusals(url: str, forwarded_for: list[str]) -> list[int]:
    """The statuses of wrong admin tokens sent one after another, each request claiming to
    come from the next of `forwarded_for`."""
    with httpx.Client(base_url=url, timeout=30) as client:
        return [
            client.get(
                "/v1/tokens",
                headers={"Authorization": f"Bearer fba_wrong{n}", "X-Forwarded-For": address},
            ).status_code
            for n, address in enumerate(forwarded_for)
        ]


SPOOFED = [f"203.0.113.{n}" for n in range(1, 21)]


def test_forwarded_addresses_are_not_believed_by_default(
    tmp_path: Path, migrated_sqlite_file: Path
) -> None:
    """A client naming a new X-Forwarded-For address with each wrong token is still one
    address: refused 429 past the limit, as any other."""
    with serving(tmp_path, migrated_sqlite_file) as served:
        statuses = refusals(served.url, SPOOFED)
    assert statuses == [401] * REFUSALS + [429] * (len(SPOOFED) - REFUSALS)


def test_forwarded_addresses_are_believed_from_the_configured_proxies(
    tmp_path: Path, migrated_sqlite_file: Path
) -> None:
    """Behind a proxy (here this test, on loopback) each client is counted apart."""
    with serving(tmp_path, migrated_sqlite_file, forwarded_allow_ips="127.0.0.1") as served:
        spread = refusals(served.url, SPOOFED)
        one = refusals(served.url, ["198.51.100.7"] * (REFUSALS + 2))
    assert spread == [401] * len(SPOOFED)
    assert one == [401] * REFUSALS + [429] * 2


SECRET = "fbn_" + "S3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3c"


def test_the_access_log_keeps_no_secret_of_a_query_string(
    tmp_path: Path, migrated_sqlite_file: Path
) -> None:
    """A token sent in a query string (the registry reads tokens from the Authorization
    header alone, but a client may be configured wrong) is not written to the log; the rest
    of the query, what was asked, is."""
    query = (
        f"model=m&prompt_tokens=512&token={SECRET}&Access_Token=hunter2&api%5Fkey=k3y"
        f"&password=pw&as_node={SECRET}"
    )
    with serving(tmp_path, migrated_sqlite_file, "--access-log") as served:
        assert httpx.get(f"{served.url}/v1/nodes?{query}").status_code == 200
        log = served.stop()
    redacted = (
        "model=m&prompt_tokens=512&token=[redacted]&Access_Token=[redacted]"
        "&api%5Fkey=[redacted]&password=[redacted]&as_node=[redacted]"
    )
    assert f'"GET /v1/nodes?{redacted} HTTP/1.1" 200' in log
    for secret in ("S3cr3t", "hunter2", "k3y", "=pw"):
        assert secret not in log


def send_head(port: int, head: bytes) -> bytes:
    """What the registry answers a request of this head (its bytes as given), until it
    closes the connection or has sent a whole answer; b"" when it hangs up without one."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        try:
            connection.sendall(head)
            while chunk := connection.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    header, _, body = answer.partition(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":")[1])
                        for line in header.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    )
                    if len(body) >= length:
                        break
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused before it was all read: the kernel resets the connection
    return answer


def test_a_log_line_cannot_be_forged_by_a_request(
    tmp_path: Path, migrated_sqlite_file: Path
) -> None:
    """What a request says of itself reaches the log (here the client address a proxy
    forwarded, holding NEL, U+0085, where the log's readers split lines): it is written as
    its escape, and the log has no line the request made."""
    forged = b"GET /v1/x HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 192.0.2.1\x85forged\r\n\r\n"
    with serving(
        tmp_path, migrated_sqlite_file, "--access-log", forwarded_allow_ips="127.0.0.1"
    ) as served:
        answer = send_head(served.port, forged)
        log = served.stop()
    assert answer.startswith(b"HTTP/1.1 404 ")
    assert '192.0.2.1\\x85forged:0 - "GET /v1/x HTTP/1.1" 404' in log
    assert not [line for line in log.splitlines() if line.startswith("forged")]


@pytest.mark.parametrize("header_bytes", [200_000, 2_000_000])
def test_an_oversized_request_head_is_refused(
    tmp_path: Path, migrated_sqlite_file: Path, header_bytes: int
) -> None:
    head = b"GET /livez HTTP/1.1\r\nHost: a\r\n%s\r\n"
    big = b"X-Big: " + b"a" * header_bytes + b"\r\n"
    usual = b"Authorization: Bearer " + b"t" * 8_000 + b"\r\n"
    with serving(tmp_path, migrated_sqlite_file) as served:
        refused = send_head(served.port, head % big)
        assert send_head(served.port, head % usual).startswith(b"HTTP/1.1 200 ")
        assert served.process.poll() is None
    # 431, or, when the rest of the head was still arriving, a reset
    assert refused == b"" or refused.startswith(b"HTTP/1.1 431 "), refused[:200]
