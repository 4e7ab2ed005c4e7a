"""Probes and the fingerprint, on this machine and on captured outputs of others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetbench.agent.fingerprint import fingerprint_of, take_fingerprint
from fleetbench.agent.probes import PROBES, Collected, NoData, ProbeResult, register, run_probes
from fleetbench.agent.probes.host import HostProbe, parse_cpuinfo, parse_meminfo, parse_os_release
from tests.factories import FIXTURES

EPYC = FIXTURES / "probes" / "linux-epyc"


def test_host_probe_reads_a_captured_linux_machine(tmp_path: Path) -> None:
    """The captured machine's figures, not this one's: its cpuinfo doubled into two sockets
    (4 cores, 4 threads) and a meminfo of 64 GiB, which this machine does not have."""
    one_socket = (EPYC / "cpuinfo").read_text()
    (tmp_path / "cpuinfo").write_text(
        one_socket + one_socket.replace("physical id\t: 0", "physical id\t: 1")
    )
    (tmp_path / "meminfo").write_text("MemTotal:       67108864 kB\nMemFree:  1024 kB\n")
    collected = HostProbe(proc=tmp_path, etc=EPYC).collect()
    assert collected.data["cpu_model"] == "AMD EPYC"
    assert (collected.data["cpu_sockets"], collected.data["cpu_cores"]) == (2, 4)
    assert collected.data["cpu_threads"] == 4
    assert collected.data["memory_bytes"] == 64 * 2**30
    assert collected.data["os_release"] == "Debian GNU/Linux 12 (bookworm)"
    assert "hostname" not in collected.data
    assert set(collected.identity) <= set(collected.data)
    captured = HostProbe(proc=EPYC, etc=EPYC).collect().data  # the file as captured
    assert (captured["cpu_sockets"], captured["cpu_cores"], captured["cpu_threads"]) == (1, 2, 2)


def test_parse_cpuinfo_counts_sockets_cores_and_threads() -> None:
    one_socket = (EPYC / "cpuinfo").read_text()
    two_sockets = one_socket + one_socket.replace("physical id\t: 0", "physical id\t: 1")
    assert parse_cpuinfo(one_socket) == {
        "model": "AMD EPYC",
        "sockets": 1,
        "cores": 2,
        "threads": 2,
    }
    assert parse_cpuinfo(two_sockets) | {"model": None} == {
        "model": None,
        "sockets": 2,
        "cores": 4,
        "threads": 4,
    }
    assert parse_cpuinfo("") == {"model": None, "sockets": None, "cores": None, "threads": None}


def test_parse_meminfo() -> None:
    assert parse_meminfo("MemTotal:       16384 kB\n") == 16 * 2**20
    assert parse_meminfo("MemFree: 1 kB\n") is None


def test_parse_os_release() -> None:
    assert parse_os_release((EPYC / "os-release").read_text()) == ("Debian GNU/Linux 12 (bookworm)")
    assert parse_os_release('NAME="x"\n') is None


@pytest.fixture
def scratch_probes() -> Any:
    before = dict(PROBES)
    yield
    PROBES.clear()
    PROBES.update(before)


def test_run_probes_turns_failures_into_notes(scratch_probes: None) -> None:
    @register("broken", default_enabled=False)
    class Broken:
        def collect(self) -> Collected:
            raise RuntimeError("ioctl failed")

    @register("absent", default_enabled=False)
    class Absent:
        def collect(self) -> Collected:
            raise NoData("no such device")

    results = {r.name: r for r in run_probes(["host", "broken", "absent", "nope"])}
    assert results["host"].ok and results["host"].collected is not None
    assert (results["broken"].ok, results["broken"].note) == (False, "RuntimeError: ioctl failed")
    assert (results["absent"].ok, results["absent"].note) == (True, "no such device")
    assert (results["nope"].ok, results["nope"].note) == (False, "no probe named 'nope'")


def _result(name: str, data: dict[str, Any], identity: tuple[str, ...]) -> ProbeResult:
    return ProbeResult(name, True, Collected(data, identity))


def test_fingerprint_hashes_identity_only() -> None:
    gpu = {"name": "NVIDIA L4", "driver_version": "550.54.15", "temperature_c": 41}
    base = fingerprint_of([_result("nvidia", gpu, ("name", "driver_version"))])
    warmer = fingerprint_of(
        [_result("nvidia", {**gpu, "temperature_c": 77}, ("name", "driver_version"))]
    )
    new_driver = fingerprint_of(
        [_result("nvidia", {**gpu, "driver_version": "560.28.03"}, ("name", "driver_version"))]
    )
    assert base.hash == warmer.hash
    assert base.hash != new_driver.hash
    assert base.data["probes"]["nvidia"]["temperature_c"] == 41  # kept, just not hashed
    assert base.data["complete"] is True


def test_a_failed_probe_makes_the_fingerprint_incomplete() -> None:
    host = _result("host", {"cpu_model": "AMD EPYC"}, ("cpu_model",))
    failed = ProbeResult("nvidia", False, note="NVMLError_Unknown: Unknown Error")
    complete = fingerprint_of([host])
    incomplete = fingerprint_of([host, failed])
    assert incomplete.hash != complete.hash
    assert incomplete.data["complete"] is False
    assert incomplete.data["notes"] == {"nvidia": "NVMLError_Unknown: Unknown Error"}


def test_this_machine_keeps_its_fingerprint() -> None:
    first, second = take_fingerprint(), take_fingerprint()
    assert first.hash == second.hash
    assert len(first.hash) == 64
    assert first.data["probes"]["host"]["cpu_threads"] >= 1
