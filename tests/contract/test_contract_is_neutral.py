"""The contract belongs to neither side: importing it loads pydantic and the standard
library, nothing of the agent's or the registry's."""

from __future__ import annotations

import json
import subprocess
import sys

# pydantic and what it brings
ALLOWED = {"pydantic", "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection"}


def test_the_contract_imports_nothing_but_pydantic() -> None:
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import fleetbench.contract.answers, fleetbench.contract.bounds\n"
        "import fleetbench.contract.kv_cache, fleetbench.contract.wire\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('fleetbench.'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    top_level, ours = (json.loads(line) for line in done.stdout.splitlines())
    known = {*sys.stdlib_module_names, *ALLOWED, "fleetbench"}
    # _sysconfigdata_*: the standard library's build settings, which sysconfig loads
    outside = [m for m in top_level if m not in known and not m.startswith("_sysconfigdata")]
    assert outside == []
    assert all(m.startswith("fleetbench.contract") for m in ours)
    assert "fleetbench.contract.wire" in ours
