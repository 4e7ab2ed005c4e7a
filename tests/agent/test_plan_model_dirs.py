"""Which of a node's files a plan may have it read: only those in the directories its
operator allows (agent.plan_model_dirs), however the plan writes the path (`..`, a symlink,
relative), refused before anything there is looked at, so the refusal tells nothing of the
file; and a model is hashed only when it is a regular file, never past its size."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from fleetbench.agent.daemon_config import ConfigError, load_config
from fleetbench.agent.gguf_model import sha256_of
from fleetbench.agent.plans import PlannedSweep, resolve_plan
from fleetbench.contract.plans import PlanVersion

REFUSAL = "is not in a directory this node lets plans load models from (agent.plan_model_dirs)"


def _resolved(model: dict[str, Any], cache: Path, allowed: list[Path]) -> PlannedSweep:
    plan = PlanVersion.model_validate(
        {
            "name": "probe",
            "version": 1,
            "created_at": "2026-12-01T00:00:00Z",
            "model": model,
            "cron": "0 3 * * *",
        }
    )
    # a node of one byte of memory: a file the plan reached would be said too large for it
    return resolve_plan(plan, sha256_cache=cache, allowed_model_dirs=allowed, memory_bytes=1)


@pytest.fixture
def models(tmp_path: Path, tiny_llama: Path) -> Path:
    """An allowed folder holding a model, a symlink to a file outside it and one to the
    folder above it; the file outside, beside it."""
    allowed = tmp_path / "models"
    allowed.mkdir()
    shutil.copy(tiny_llama, allowed / "tiny.gguf")
    (tmp_path / "secret.gguf").write_text("the node's own file, not a plan's to read")
    (allowed / "escape.gguf").symlink_to(tmp_path / "secret.gguf")
    (allowed / "up").symlink_to(tmp_path, target_is_directory=True)
    return allowed


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "place",
    [
        "{allowed}/../secret.gguf",
        "../secret.gguf",  # relative to the daemon's working directory, the allowed folder
        "{allowed}/escape.gguf",
        "{allowed}/up/secret.gguf",
        "/proc/self/environ",
        "/proc/self/pagemap",
        "/etc/hostname",
    ],
)
def test_a_plan_cannot_have_a_node_read_a_file_outside_its_model_directories(
    models: Path, tmp_path: Path, place: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(models)
    path = place.format(allowed=models)
    cache = tmp_path / "sha256.json"
    planned = _resolved({"path": path, "sha256": "0" * 64}, cache, [models])
    assert (planned.sweep, planned.skipped) == (None, f"{path} {REFUSAL}")
    assert not cache.exists()  # nothing was hashed


def test_the_refusal_says_the_same_of_a_file_that_exists_and_one_that_does_not(
    models: Path, tmp_path: Path
) -> None:
    said = {
        name: _resolved({"path": str(tmp_path / name)}, tmp_path / "c.json", [models]).skipped
        for name in ("secret.gguf", "nowhere.gguf")
    }
    assert said == {name: f"{tmp_path / name} {REFUSAL}" for name in said}


def test_the_model_directories_are_agent_toml_s_absolute_paths(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nplan_model_dirs = ["/srv/models", "/data/gguf"]\n')
    assert load_config(config).settings.plan_model_dirs == [Path("/srv/models"), Path("/data/gguf")]
    config.write_text('[agent]\nplan_model_dirs = ["/srv/models", "models"]\n')
    with pytest.raises(ConfigError) as raised:  # else it means wherever the daemon started
        load_config(config)
    assert str(raised.value) == (
        f"{config}: agent.plan_model_dirs[1]: Value error, models is not an absolute path"
    )


def test_a_node_allowing_no_model_directory_loads_no_plan_s_model(
    models: Path, tmp_path: Path
) -> None:
    model = {"path": str(models / "tiny.gguf")}
    refused = _resolved(model, tmp_path / "c.json", [])
    assert refused.skipped == f"{models / 'tiny.gguf'} {REFUSAL}"


def test_a_path_that_resolves_inside_the_allowed_directories_is_loaded(
    models: Path, tmp_path: Path
) -> None:
    winding = models / "up" / "models" / "tiny.gguf"  # out by a symlink, back in by name
    plan = PlanVersion.model_validate(
        {
            "name": "nightly",
            "version": 1,
            "created_at": "2026-12-01T00:00:00Z",
            "model": {"path": str(winding), "sha256": _sha256(models / "tiny.gguf")},
            "cron": "0 3 * * *",
        }
    )
    planned = resolve_plan(plan, sha256_cache=tmp_path / "c.json", allowed_model_dirs=[models])
    assert planned.skipped is None
    assert planned.sweep is not None and planned.sweep.model == winding


def test_search_dirs_must_lie_in_the_allowed_directories_and_are_not_left_by_a_symlink(
    models: Path, tmp_path: Path
) -> None:
    secret = _sha256(tmp_path / "secret.gguf")
    cache = tmp_path / "sha256.json"
    outside = _resolved(
        {"search_dirs": [str(models), str(tmp_path)], "sha256": secret}, cache, [models]
    )
    assert outside.skipped == f"{tmp_path} {REFUSAL}"
    # the allowed folder's symlink to the secret matches its digest, and is not followed out
    inside = _resolved({"search_dirs": [str(models)], "sha256": secret}, cache, [models])
    assert inside.sweep is None
    assert inside.skipped == f"model missing: no .gguf file in {models} has sha256 {secret}"
    assert "secret" not in cache.read_text()  # tiny.gguf was hashed, the secret never


def _hashed_within(path: Path, seconds: float) -> str | BaseException | None:
    """sha256_of(path) in a thread: its digest or what it raised, or None when it had not
    finished after `seconds` (the thread is left to its fate)."""
    outcome: list[str | BaseException] = []

    def hash_it() -> None:
        try:
            outcome.append(sha256_of(path))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=hash_it, daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else None


def test_hashing_reads_a_regular_file_alone_and_no_more_of_it_than_its_size(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)  # opened for reading, it waits for a writer: for ever
    for endless in (fifo, Path("/dev/zero")):
        refused = _hashed_within(endless, 10)
        assert isinstance(refused, OSError), (endless, refused)
        assert str(refused) == f"{endless} is not a regular file"
    # /proc's files say they hold nothing, and pagemap reads on for gigabytes
    assert _hashed_within(Path("/proc/self/pagemap"), 10) == hashlib.sha256(b"").hexdigest()
