import subprocess
import sys
from pathlib import Path

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


def test_the_engine_s_process_loads_no_numpy(tiny_llama: Path) -> None:
    """The in-process sweep's engine side (what its child process runs) on a real GGUF:
    numpy, and the OpenBLAS threads it starts, would share the cores the timed loop
    measures. The output fingerprint loads it once the points are done (taken here with
    no fingerprint, so that numpy in sys.modules means it came before or with the points)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from fleetbench.agent.runners.llama_inprocess import run_sweep\n"
        "from fleetbench.contract.sweep_spec import SweepSpec\n"
        "spec = SweepSpec(npp=[8], ntg=[4], npl=[1], outputs=False)\n"
        f"outcome = run_sweep(Path({str(tiny_llama)!r}), spec)\n"
        "print(outcome.model.quantization if outcome.model else None)\n"
        "print(','.join(m for m in ('numpy', 'yaml', 'gguf') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    quantization, loaded = result.stdout.splitlines()[-2:]
    assert (quantization, loaded) == ("ALL_F32", "")
