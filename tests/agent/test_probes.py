"""Probes and the fingerprint, on this machine and on captured outputs of others."""

from __future__ import annotations

from typing import Any

import pytest

from agent.fingerprint import fingerprint_of, take_fingerprint
from agent.probes import PROBES, Collected, NoData, ProbeResult, register, run_probes
from agent.probes.host import HostProbe, parse_cpuinfo, parse_os_release
from tests.conftest import FIXTURES

EPYC = FIXTURES / "probes" / "linux-epyc"


def test_host_probe_reads_a_captured_linux_machine() -> None:
    collected = HostProbe(proc=EPYC, etc=EPYC).collect()
    assert collected.data["cpu_model"] == "AMD EPYC"
    assert collected.data["cpu_sockets"] == 1
    assert collected.data["os_release"] == "Debian GNU/Linux 12 (bookworm)"
    assert collected.data["memory_bytes"] > 0
    assert "hostname" not in collected.data
    assert set(collected.identity) <= set(collected.data)


def test_parse_cpuinfo_counts_sockets() -> None:
    one_socket = (EPYC / "cpuinfo").read_text()
    two_sockets = one_socket + one_socket.replace("physical id\t: 0", "physical id\t: 1")
    assert parse_cpuinfo(one_socket) == {"model": "AMD EPYC", "sockets": 1}
    assert parse_cpuinfo(two_sockets)["sockets"] == 2
    assert parse_cpuinfo("") == {"model": None, "sockets": None}


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
