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
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && [ -z "${CMAKE_ARGS:-}" ]; then
    # llama.cpp's AMX path crashes in decode on some of these CPUs (ggml-org/llama.cpp#20824):
    # llama.cpp is built without it, keeping AVX-512 and VNNI (llama-cpp-python here, and
    # llama.cpp's tools in build-llama-tool.sh).
    export FLEETBENCH_NO_AMX=1
    export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"
fi
_stamp="$VENV/.fleetbench-installed"
_want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-64)"
if [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
    echo "installing fleetbench and its dependencies into $VENV" >&2
    # FLEETBENCH_OFFLINE_WHEELS=DIR: a node that reaches no package index installs from DIR
    _offline=()
    if [ -n "${FLEETBENCH_OFFLINE_WHEELS:-}" ]; then
        _offline=(--no-index --find-links "$FLEETBENCH_OFFLINE_WHEELS")
    fi
    # llama-cpp-python compiles llama.cpp: its wheel is built once, from source, into a folder
    # of ours (one per set of build flags; FLEETBENCH_LLAMA_WHEELS: another, as the GPU
    # check's) and installed from there. Delete the folder to build a newer release.
    _flags="${CMAKE_ARGS:+-$(echo "$CMAKE_ARGS" | sha256sum | cut -c1-12)}"
    _wheels="${FLEETBENCH_LLAMA_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/wheels$_flags}"
    if ! ls "$_wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        echo "building llama-cpp-python's wheel into $_wheels, once (llama.cpp compiles:" \
            "about 8 minutes on 2 cores, unless pip's cache holds the wheel)" >&2
        # pip's own wheel cache does not know build flags: with CMAKE_ARGS, built afresh
        "$VENV/bin/python" -m pip wheel --quiet ${_offline[@]+"${_offline[@]}"} --no-deps \
            --no-binary llama-cpp-python ${CMAKE_ARGS:+--no-cache-dir} \
            "llama-cpp-python>=0.3.16" -w "$_wheels"
    fi
    _llama="$(ls "$_wheels"/llama_cpp_python-*.whl | sort -V | tail -n 1)"
    # uv installs the rest from its cache in seconds (pip took half a minute on 2 cores),
    # compiled to bytecode as pip would. uv reads no pip configuration: where the index is
    # configured for pip alone, pip installs instead.
    "$VENV/bin/python" -m pip install --quiet ${_offline[@]+"${_offline[@]}"} uv
    "$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python" \
        ${_offline[@]+"${_offline[@]}"} "$_llama" -e "$ROOT[dev]" || {
        echo "uv could not install them (it reads no pip configuration): pip installs them" >&2
        "$VENV/bin/python" -m pip install --quiet ${_offline[@]+"${_offline[@]}"} \
            "$_llama" -e "$ROOT[dev]"
    }
    echo "$_want" > "$_stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
