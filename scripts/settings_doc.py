"""Writes docs/settings.md from the settings models themselves (the registry's and the
agent's), so that the reference can never miss a setting or say another default; a test
fails when the file is out of date.

    .venv/bin/python scripts/settings_doc.py            # rewrite docs/settings.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetbench.agent.config import AgentSettings  # noqa: E402
from fleetbench.registry.config import RegistrySettings  # noqa: E402

DOC = ROOT / "docs" / "settings.md"
HEAD = """# Settings

Generated from the settings models by `scripts/settings_doc.py`: edit the models'
descriptions, not this file (a test fails when it is out of date).

The registry reads its settings from the environment (and a `.env` file in its working
directory). The agent's come from the environment, then, for the daemon, the `[agent]`
table of its `agent.toml`, where each key is the variable's name without `FLEETBENCH_`, in
lower case; command-line options win over both. Lists are written as JSON in a variable
(`FLEETBENCH_PLAN_BINARIES='["/opt/llama/bin/llama-batched-bench"]'`) and as TOML arrays in
`agent.toml`. A bad value stops the command with the setting named.
"""


def _default(field: FieldInfo) -> str:
    if field.default_factory in (list, dict, tuple):
        return "none"
    if field.default_factory is not None:  # the hostname, a folder of the user's
        return "see what"
    if field.default is None:
        return "none"
    value = field.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _rows(settings: type[BaseSettings]) -> list[str]:
    prefix = settings.model_config.get("env_prefix", "")
    rows = ["| variable | default | what |", "|---|---|---|"]
    for name, field in settings.model_fields.items():
        what = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name.upper()}` | {_default(field)} | {what} |")
    return rows


def render() -> str:
    parts = [HEAD]
    for title, settings in (("The registry", RegistrySettings), ("The agent", AgentSettings)):
        parts.append(f"## {title}\n\n" + "\n".join(_rows(settings)) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC.relative_to(ROOT)}")
