"""Each extra installs what one kind of machine needs and nothing more: fleetbench's wheel
installed into fresh virtual environments, its console scripts run from a folder outside
the checkout (so nothing is imported from the source tree), against a live registry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetbench.version import VERSION
from tests.factories import ARTICLE_MODEL, LiveRegistry, command, free_port, wait_until_serving
from tests.test_import_end_to_end import ARTICLE_EXAMPLE

ROOT = Path(__file__).parent.parent
_UV = str(Path(sys.executable).parent / "uv")  # the dev environment's (pyproject: dev)
# What a node must never need, and what a registry must never drag in.
REGISTRY_ONLY = ("fastapi", "sqlalchemy", "alembic", "psycopg", "plotly", "uvicorn")
AGENT_ONLY = ("llama_cpp", "gguf", "psutil", "apscheduler", "pynvml")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release's files: CI's (`.ci/run` builds them into FLEETBENCH_TEST_DIST before the
    suite), or else the sdist of the files git knows and the wheel built from that sdist, as
    an index's users would build it (from a copy: an in-place build would take whatever an
    older build left in build/)."""
    if built := os.environ.get("FLEETBENCH_TEST_DIST"):
        return Path(built)
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    folder = tmp_path_factory.mktemp("dist")
    # uv builds the sdist, then the wheel from the sdist
    subprocess.run([_UV, "build", "--quiet", "--out-dir", folder, source], check=True, timeout=600)
    return folder


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    [built] = dist.glob("fleetbench-*.whl")
    return built


def test_the_sdist_holds_the_package_and_what_builds_it_and_no_more(dist: Path) -> None:
    [sdist] = dist.glob("fleetbench-*.tar.gz")
    assert sdist.name == f"fleetbench-{VERSION}.tar.gz"
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE"} <= names
    assert "fleetbench/migrations/versions/v0_1_0_baseline.py" in names
    assert {n.split("/")[0] for n in names} <= {
        *("PKG-INFO", "setup.cfg", "pyproject.toml", "MANIFEST.in"),
        *("README.md", "CHANGELOG.md", "LICENSE"),
        *("fleetbench", "fleetbench.egg-info"),
    }


def test_the_wheel_takes_one_import_name_and_ships_its_data(wheel: Path) -> None:
    assert wheel.name == f"fleetbench-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [top_level] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["fleetbench"]
    assert {n.split("/")[0] for n in names if not n.startswith("fleetbench-")} == {"fleetbench"}
    assert "fleetbench/migrations/script.py.mako" in names
    assert "fleetbench/registry/web/static/index.html" in names


def _venv(folder: Path, requirement: str) -> Path:
    # uv resolves and installs from its cache in a second or two where pip took 20 s
    # (it builds the wheel in a tenth of pip's time too); what is tested is what the
    # extras declare, whichever installer reads it.
    python = ["--python", sys.executable]  # this interpreter's version, not uv's choice
    subprocess.run([_UV, "venv", "--quiet", *python, str(folder)], check=True, timeout=120)
    python = str(folder / "bin" / "python")
    uv = [_UV, "pip", "install", "--quiet", "--python", python, requirement]
    done = subprocess.run(uv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "bin"


@pytest.fixture(scope="module")
def agent_only(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-agent"), f"fleetbench[agent] @ {wheel.as_uri()}")


@pytest.fixture(scope="module")
def registry_only(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(
        tmp_path_factory.mktemp("venv-registry"), f"fleetbench[registry] @ {wheel.as_uri()}"
    )


def _run(bin_dir: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A console script of the environment `bin_dir`, run in `cwd` (out of the checkout),
    its spool there too."""
    state = {"XDG_STATE_HOME": str(cwd / "state"), **env}
    return command(bin_dir / args[0], *args[1:], cwd=cwd, timeout=300, **state)


def _importable(bin_dir: Path, modules: tuple[str, ...], cwd: Path) -> list[str]:
    code = (
        "import importlib.util, json, sys\n"
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))"
    )
    done = _run(bin_dir, "python", "-c", code, *modules, cwd=cwd)
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout)
    return found


def test_the_agent_extra_runs_a_node_without_the_registry_s_stack_or_llama_cpp(
    agent_only: Path,
    live_registry: LiveRegistry,
    batched_bench: Path,
    gemma: Path,
    tmp_path: Path,
) -> None:
    assert _importable(agent_only, (*REGISTRY_ONLY, "llama_cpp"), tmp_path) == []
    env = {"FLEETBENCH_REGISTRY_URL": live_registry.url}
    token = live_registry.token("m4pro")

    imported = _run(
        agent_only, "fleetbench-agent", "import", str(ARTICLE_EXAMPLE), "--node", "m4pro",
        "--model", ARTICLE_MODEL, "--token", token, cwd=tmp_path, **env,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("created: run ")

    answer = _run(
        agent_only, "fleetbench-agent", "placement", "--model", ARTICLE_MODEL,
        "--min-tps-per-user", "15", "--json", cwd=tmp_path, **env,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    [candidate] = json.loads(answer.stdout)["candidates"]
    assert (candidate["node"], candidate["concurrency"]) == ("m4pro", 8)

    fingerprint = _run(agent_only, "fleetbench-agent", "fingerprint", cwd=tmp_path)
    assert fingerprint.returncode == 0, fingerprint.stderr
    assert json.loads(fingerprint.stdout)["data"]["probes"]["host"]["cpu_threads"] >= 1

    swept = _run(
        agent_only, "fleetbench-agent", "sweep", "-m", str(gemma), "--binary", str(batched_bench),
        "--npp", "32", "--ntg", "4", "--npl", "1,2", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    run = json.loads(swept.stdout)
    assert (run["status"], run["engine"]["binding"]) == ("ok", "llama-batched-bench")
    assert [p["b"] for p in run["points"]] == [1, 2]
    assert run["model"]["n_layer"] == 18  # Gemma 3 270M, from the file's header

    status = _run(agent_only, "fleetbench-agent", "status", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    [spooled] = json.loads(status.stdout)  # the import went through the spool
    assert spooled["state"] == "delivered"


def test_without_the_llama_extra_an_in_process_sweep_names_the_extra(
    agent_only: Path, tiny_llama: Path, tmp_path: Path
) -> None:
    swept = _run(agent_only, "fleetbench-agent", "sweep", "-m", str(tiny_llama), cwd=tmp_path)
    assert swept.returncode == 2
    assert "pip install 'fleetbench[llama]'" in swept.stderr
    assert "Traceback" not in swept.stderr

    config = tmp_path / "agent.toml"
    config.write_text(f'[[sweep]]\nname = "nightly"\nmodel = "{tiny_llama}"\ncron = "0 3 * * *"\n')
    daemon = _run(agent_only, "fleetbench-agent", "daemon", "--config", str(config), cwd=tmp_path)
    assert daemon.returncode == 2
    assert "sweep[0]" in daemon.stderr and "fleetbench[llama]" in daemon.stderr


@pytest.fixture
def registry_from_its_extra(
    registry_only: Path, empty_database_url: str, tmp_path: Path
) -> Iterator[str]:
    env = {"FLEETBENCH_DATABASE_URL": empty_database_url}
    migrated = _run(registry_only, "fleetbench-registry", "migrate", cwd=tmp_path, **env)
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    argv = [str(registry_only / "fleetbench-registry"), "serve", "--port", str(port)]
    log = tmp_path / "registry.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_")}
    with log.open("w") as stderr:
        server = subprocess.Popen(argv, cwd=tmp_path, env={**clean, **env}, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until_serving(url, server, log=log).status_code == 200
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_registry_extra_migrates_and_serves_without_the_agent_s_engines(
    registry_only: Path, registry_from_its_extra: str, tmp_path: Path
) -> None:
    assert _importable(registry_only, AGENT_ONLY, tmp_path) == []
    created = httpx.post(f"{registry_from_its_extra}/v1/runs", json={}, timeout=30)
    assert created.status_code == 401  # served and guarded: a report needs a node's token
    page = httpx.get(f"{registry_from_its_extra}/", timeout=30)
    assert page.status_code == 200 and "fleetbench" in page.text
    schema = httpx.get(f"{registry_from_its_extra}/openapi.json", timeout=30).json()
    assert "/v1/placement" in schema["paths"]


def test_a_command_without_its_extra_names_the_extra(
    agent_only: Path, registry_only: Path, tmp_path: Path
) -> None:
    for bin_dir, script, extra in (
        (agent_only, ("fleetbench-registry", "--help"), "registry"),
        (registry_only, ("fleetbench-agent", "fingerprint"), "agent"),
    ):
        done = _run(bin_dir, *script, cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        assert f"pip install 'fleetbench[{extra}]'" in done.stderr
        assert "Traceback" not in done.stderr
