# Sourced by the other scripts: a virtual environment in .venv with fleetbench and its dev
# tools installed (editable), reinstalled only when pyproject.toml changes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLEETBENCH_VENV:-$ROOT/.venv}"

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "fleetbench needs Python 3.11 or newer; python3 is $(python3 --version 2>&1)" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtual environment in $VENV" >&2
    python3 -m venv "$VENV"
fi
_stamp="$VENV/.fleetbench-installed"
_want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-64)"
if [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
    echo "installing fleetbench and its dependencies into $VENV" >&2
    echo "(llama-cpp-python compiles llama.cpp the first time: about 8 minutes on 2 cores;" >&2
    echo " pip keeps the built wheel, so later installs take seconds)" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
    echo "$_want" > "$_stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
