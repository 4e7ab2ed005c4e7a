"""deploy/ checked without a container engine or a cluster (none runs here): each file
parses, holds the fields its tool requires, runs commands the console scripts have, with
options they take, sets only settings that exist, probes routes the registry serves, and is
locked down as the README says (one token per node, non-root, no privilege escalation,
read-only root, memory limits, pinned images)."""

from __future__ import annotations

import json
import plistlib
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from fleetbench.agent.cli import app as agent_app
from fleetbench.agent.config import AgentSettings
from fleetbench.agent.daemon_config import load_config
from fleetbench.registry.cli import app as registry_app
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.main import create_app

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
CLIS = {"fleetbench-agent": agent_app, "fleetbench-registry": registry_app}
VENV_BIN = "/opt/fleetbench/venv/bin/"


def assert_runs(script: str, args: list[str]) -> None:
    """`script ARGS` names a command of that console script and only options it takes."""
    name = script.removeprefix(VENV_BIN)
    assert name in SCRIPTS, script
    commands: dict[str, Any] = typer.main.get_command(CLIS[name]).commands  # type: ignore[attr-defined]
    command = commands.get(args[0])
    assert command is not None, f"{name} has no command {args[0]!r}"
    options = {opt for param in command.params for opt in param.opts}
    given = {arg.split("=")[0] for arg in args[1:] if arg.startswith("-")}
    assert given <= options, (name, args[0], given - options)


def assert_settings(names: set[str], settings: type[Any]) -> None:
    """Every FLEETBENCH_* name among `names` is a setting of that side."""
    known = {f"FLEETBENCH_{field.upper()}" for field in settings.model_fields}
    ours = {name for name in names if name.startswith("FLEETBENCH_")}
    assert ours <= known, ours - known


def registry_paths() -> set[str]:
    paths: dict[str, Any] = create_app(RegistrySettings(database_url="sqlite://")).openapi()[
        "paths"
    ]
    return set(paths)


def assert_locked_down(container: dict[str, Any]) -> None:
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "memory" in container["resources"]["limits"]
    image = container["image"]
    assert ":" in image and not image.endswith(":latest"), image


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments), continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def _one(instructions: list[tuple[str, str]], name: str) -> Any:
    [value] = [rest for instruction, rest in instructions if instruction == name]
    return json.loads(value)


def test_the_registry_image_installs_the_registry_alone_and_serves() -> None:
    steps = dockerfile(DEPLOY / "container" / "registry.Dockerfile")
    assert steps[0][0] == "FROM"
    runs = " ".join(rest for instruction, rest in steps if instruction == "RUN")
    assert '"/src[registry]"' in runs and "llama" not in runs
    [entrypoint] = _one(steps, "ENTRYPOINT")
    command = _one(steps, "CMD")
    assert_runs(entrypoint, command)
    assert command[command.index("--port") + 1] == str(_one(steps, "EXPOSE"))  # 8787
    assert ("USER", "fleetbench") in steps


def test_the_agent_image_compiles_llama_cpp_for_the_backend_asked_and_ships_no_compiler() -> None:
    steps = dockerfile(DEPLOY / "container" / "agent.Dockerfile")
    args = {rest.split("=")[0]: rest.split("=", 1)[1] for i, rest in steps if i == "ARG"}
    assert args == {
        "BUILD_IMAGE": "debian:12.8-slim",
        "RUNTIME_IMAGE": "debian:12.8-slim",
        "GGML_CUDA": "OFF",
        "CUDA_ARCHITECTURES": "native",
    }
    stages = [rest for i, rest in steps if i == "FROM"]
    assert stages == ["${BUILD_IMAGE} AS build", "${RUNTIME_IMAGE}"]
    runtime = steps[[i for i, _ in steps].index("FROM", 3) :]
    [install] = [rest for i, rest in steps if i == "RUN" and "/src[llama]" in rest]
    assert "-DGGML_CUDA=${GGML_CUDA}" in install
    assert "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" in install
    shipped = " ".join(rest for i, rest in runtime if i == "RUN")
    assert not {"build-essential", "cmake", "git", "python3-dev"} & set(shipped.split())
    assert ("COPY", "--from=build /opt/fleetbench/venv /opt/fleetbench/venv") in runtime
    [entrypoint] = _one(steps, "ENTRYPOINT")
    command = _one(steps, "CMD")
    assert_runs(entrypoint, command)
    assert _one(steps, "VOLUME") == ["/var/lib/fleetbench"]  # the spool outlives the container


def test_docker_leaves_the_checkout_s_environment_and_models_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "*.gguf", "build"} <= set(ignored)


def test_compose_migrates_once_then_serves_with_two_workers_on_postgres_with_your_password() -> (
    None
):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "registry"}
    migrate, registry = services["migrate"], services["registry"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert registry["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert migrate["build"] == registry["build"]
    assert (DEPLOY.parent / registry["build"]["dockerfile"]).is_file()
    assert migrate["environment"] == registry["environment"]
    url = registry["environment"]["FLEETBENCH_DATABASE_URL"]
    postgres = services["postgres"]["environment"]
    assert url == (
        f"postgresql+psycopg://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}"
        f"@postgres:5432/{postgres['POSTGRES_DB']}"
    )
    for service in (migrate, registry):
        assert_runs("fleetbench-registry", service["command"])
    assert registry["command"][registry["command"].index("--workers") + 1] == "2"
    assert registry["ports"] == ["127.0.0.1:8787:8787"]  # not the world, in plain HTTP
    for service in (migrate, registry):
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
        assert service["security_opt"] == ["no-new-privileges:true"] and "mem_limit" in service
    # no password written in the file: compose refuses to start without deploy/.env's
    assert postgres["POSTGRES_PASSWORD"] == "${POSTGRES_PASSWORD:?set it in deploy/.env}"
    assert "deploy/.env" in (ROOT / ".gitignore").read_text().split()
    assert_settings(set(registry["environment"]), RegistrySettings)
    for service in services.values():
        assert ":" in service["image"] and not service["image"].endswith(":latest")


def _image_uid(dockerfile_name: str) -> int:
    runs = [r for i, r in dockerfile(DEPLOY / "container" / dockerfile_name) if i == "RUN"]
    [useradd] = [r for r in runs if r.startswith("useradd")]
    return int(useradd.split("--uid")[1].split()[0])


def _manifests(name: str) -> dict[str, dict[str, Any]]:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))
    for document in documents:
        assert {"apiVersion", "kind", "metadata"} <= set(document), document
    return {d["kind"]: d for d in documents}


def test_kubernetes_runs_a_migration_job_and_a_registry_behind_its_service() -> None:
    manifests = _manifests("registry.yaml")
    assert set(manifests) == {"Job", "Deployment", "Service"}
    job, deployment, service = manifests["Job"], manifests["Deployment"], manifests["Service"]
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    assert_runs("fleetbench-registry", migrate["args"])
    assert migrate["args"] == ["migrate"]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    [registry] = pod["spec"]["containers"]
    assert_runs("fleetbench-registry", registry["args"])
    [port] = registry["ports"]
    assert registry["args"][registry["args"].index("--port") + 1] == str(port["containerPort"])
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    # ready: it and its database answer; alive: the process does (a database outage
    # takes pods out of the Service and restarts none)
    assert registry["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert registry["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert {"/readyz", "/livez"} <= registry_paths()
    assert registry["args"][registry["args"].index("--workers") + 1] == "1"  # pods scale it
    # two versions never share the database: the old pods go before the new start
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    uid = _image_uid("registry.Dockerfile")
    for spec in (pod["spec"], job["spec"]["template"]["spec"]):
        assert spec["securityContext"] == {
            "runAsUser": uid,
            "runAsGroup": uid,
            "runAsNonRoot": True,
        }
    for container in (registry, migrate):
        assert_locked_down(container)
    # the one place it writes with a read-only root: /tmp (serve's metrics of its workers)
    assert {m["mountPath"] for m in registry["volumeMounts"]} == {"/tmp"}
    assert registry["env"] == migrate["env"]  # the same database, from the same Secret
    assert_settings({e["name"] for e in registry["env"]}, RegistrySettings)


def test_kubernetes_runs_an_agent_on_each_gpu_node_with_that_node_s_token_alone() -> None:
    manifests = _manifests("agent-daemonset.yaml")
    assert set(manifests) == {"ConfigMap", "DaemonSet"}
    pod = manifests["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    [agent] = pod["containers"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["FLEETBENCH_NODE"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "command" not in agent  # the image's entrypoint: fleetbench-agent
    assert_runs("fleetbench-agent", agent["args"])
    assert_settings(set(env), AgentSettings)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    # the token is a file on the node itself (no Secret holds every node's), read again
    # before each delivery
    assert not [v for v in volumes.values() if "secret" in v]
    # (a folder: a token rotated by a new file in its place is seen)
    assert volumes["token"]["hostPath"] == {
        "path": "/etc/fleetbench/node-token",
        "type": "Directory",
    }
    assert env["FLEETBENCH_TOKEN_FILE"]["value"] == mounts["token"] + "/token"
    spool = Path(env["FLEETBENCH_SPOOL"]["value"])
    assert spool.is_relative_to(mounts["state"]) and "hostPath" in volumes["state"]
    # every GPU of the node, through the NVIDIA runtime; none held from workloads
    assert pod["runtimeClassName"] == "nvidia"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert not any("nvidia.com" in key for key in agent["resources"].get("limits", {}))
    assert_locked_down(agent)
    # what it writes with a read-only root: its state (spool, caches: the image's XDG_*
    # are under it) and /tmp
    image = dict(dockerfile(DEPLOY / "container" / "agent.Dockerfile"))
    for variable in image["ENV"].split():
        assert Path(variable.split("=")[1]).is_relative_to(mounts["state"]), variable
    writable = {m["mountPath"] for m in agent["volumeMounts"] if not m.get("readOnly")}
    assert writable - {"/etc/fleetbench/agent.toml"} == {mounts["state"], "/tmp"}
    # runs as the image's user, which owns its token file and its state on the node
    uid = _image_uid("agent.Dockerfile")
    assert pod["securityContext"] == {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True}
    [owner] = pod["initContainers"]
    assert owner["command"] == ["chown", f"{uid}:{uid}", mounts["state"]]
    assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert owner["securityContext"]["allowPrivilegeEscalation"] is False
    assert {m["mountPath"] for m in owner["volumeMounts"]} == {mounts["state"]}


def test_the_daemonset_s_agent_toml_is_one_the_agent_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(_manifests("agent-daemonset.yaml")["ConfigMap"]["data"]["agent.toml"])
    monkeypatch.delenv("FLEETBENCH_REGISTRY_URL", raising=False)
    loaded = load_config(config)
    assert loaded.settings.registry_url == "http://fleetbench-registry:8787"  # the Service
    assert [s.name for s in loaded.sweeps] == ["nemo-nightly"]


def test_the_launchd_daemon_runs_the_agent_and_restarts_it_after_a_crash() -> None:
    plist = plistlib.loads((DEPLOY / "macos" / "com.fleetbench.agent.plist").read_bytes())
    assert plist["Label"] == "com.fleetbench.agent"
    script, *args = plist["ProgramArguments"]
    assert_runs(script, args)
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["UserName"] == "fleetbench"


HARDENING = {"NoNewPrivileges=true", "ProtectSystem=strict", "PrivateTmp=true"}


@pytest.mark.parametrize(
    ("unit", "settings"),
    [
        ("fleetbench-agent.service", AgentSettings),
        ("fleetbench-registry.service", RegistrySettings),
    ],
)
def test_the_systemd_units_run_commands_the_scripts_have_hardened(
    unit: str, settings: type[Any]
) -> None:
    lines = (DEPLOY / unit).read_text().splitlines()
    commands = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStart")]
    assert commands
    for command in commands:
        script, *args = shlex.split(command)
        assert_runs(script, args)
    variables = [line.split("=", 2)[1] for line in lines if line.startswith("Environment=")]
    assert_settings(set(variables), settings)
    assert set(lines) >= HARDENING


def test_the_agent_s_unit_hands_it_its_token_as_a_credential() -> None:
    """systemd copies the root-only token file for the agent alone (LoadCredential=), and
    the agent reads the copy (FLEETBENCH_TOKEN_FILE, in $CREDENTIALS_DIRECTORY, %d)."""
    lines = (DEPLOY / "fleetbench-agent.service").read_text().splitlines()
    assert "LoadCredential=token:/etc/fleetbench/token" in lines
    assert "Environment=FLEETBENCH_TOKEN_FILE=%d/token" in lines
    assert not [
        line
        for line in lines
        if line.startswith(("EnvironmentFile", "Environment=FLEETBENCH_TOKEN="))
    ]
