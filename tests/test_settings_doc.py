"""docs/settings.md is what scripts/settings_doc.py makes of the settings models now: a
setting added, or a default changed, without the reference following fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fleetbench.agent.config import AgentSettings
from fleetbench.registry.config import RegistrySettings

ROOT = Path(__file__).resolve().parent.parent


def test_the_settings_reference_is_the_models_own() -> None:
    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts/settings_doc.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    written = (ROOT / "docs" / "settings.md").read_text()
    assert written == generator.render(), "run: .venv/bin/python scripts/settings_doc.py"
    for settings in (RegistrySettings, AgentSettings):
        for name, field in settings.model_fields.items():
            assert field.description, f"{settings.__name__}.{name} says nothing of itself"
            assert f"`FLEETBENCH_{name.upper()}`" in written
