import subprocess
import sys

HEAVY = ("sqlalchemy", "fastapi", "llama_cpp", "alembic")


def test_importing_the_agent_loads_no_sqlalchemy_fastapi_or_llama_cpp() -> None:
    code = (
        "import sys, fleetbench.agent.cli, fleetbench.agent.client, fleetbench.agent.importer\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
