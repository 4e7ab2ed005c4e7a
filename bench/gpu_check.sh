#!/usr/bin/env bash
# The GPU check, one script for the day an NVIDIA node is lent: builds llama-cpp-python and
# llama-batched-bench for CUDA (the GPU's architecture from nvidia-smi, ccache where it is
# installed, the built wheel kept for the next run), then bench/gpu_check.py measures: the
# NVML fingerprint, an in-process and a --binary sweep of Gemma 3 270M at B = 1..64 with every
# layer offloaded, each reported to a local registry, the checks (CUDA backend,
# engine_on_accelerator, NVML's memory beside the logged buffers), 5 fidelity pairs and
# placement's answer, all in OUT/summary.json (format: README, "The GPU check").
#   bench/gpu_check.sh [--out DIR] [--wheels DIR]    on an NVIDIA node with the CUDA toolkit
#   bench/gpu_check.sh --cpu-dry-run [--out DIR]     the same steps on the CPU, small
# --wheels DIR: install offline from DIR (wheels, and llama-cpp-python's sdist), for a node
# that reaches no package index. Without a GPU it stops at once (exit 2) and says so.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.fleetbench/gpu-check"
MODE=gpu
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu-dry-run) MODE=cpu; shift ;;
        --out) OUT="$(realpath -m "${2:?--out takes a folder}")"; shift 2 ;;
        --wheels) export FLEETBENCH_OFFLINE_WHEELS="$(realpath "${2:?--wheels takes a folder}")"; shift 2 ;;
        *) echo "usage: $0 [--cpu-dry-run] [--out DIR] [--wheels DIR]" >&2; exit 2 ;;
    esac
done

if [ "$MODE" = gpu ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "no NVIDIA GPU here: nvidia-smi is not installed. The GPU check needs an NVIDIA" \
            "GPU and its driver; '$0 --cpu-dry-run' runs its steps on the CPU." >&2
        exit 2
    fi
    if ! GPUS="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null)" \
        || [ -z "$GPUS" ]; then
        echo "no NVIDIA GPU here: nvidia-smi found none ($(nvidia-smi 2>&1 | head -n 3))." >&2
        exit 2
    fi
    command -v nvcc >/dev/null 2>&1 || {
        echo "the CUDA toolkit is missing: nvcc is not on PATH (llama.cpp's CUDA build needs it)" >&2
        exit 2
    }
    ARCH="$(echo "$GPUS" | head -n 1 | cut -d, -f2 | tr -d ' .')"
    [[ "$ARCH" =~ ^[0-9]+$ ]] || { echo "nvidia-smi gave no compute capability: $GPUS" >&2; exit 2; }
    echo "GPU: $(echo "$GPUS" | head -n 1 | cut -d, -f1); building for sm_$ARCH" >&2
    LAUNCHER=()
    if command -v ccache >/dev/null 2>&1; then
        LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    fi
    # Not native: the wheel is kept and may serve another host CPU (and no AMX, whose CPU
    # decode path crashes on some hosts, ggml-org/llama.cpp#20824); the GPU does the work.
    export CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DGGML_NATIVE=OFF ${LAUNCHER[*]:-}"
    export CMAKE_BUILD_PARALLEL_LEVEL="$(getconf _NPROCESSORS_ONLN)"
    # a CUDA wheel of its own, built once per arch by bootstrap.sh, in a venv of its own
    export FLEETBENCH_LLAMA_WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/wheels-cuda-sm$ARCH"
    export FLEETBENCH_VENV="${FLEETBENCH_VENV:-$ROOT/.venv-cuda}"
fi

source "$ROOT/scripts/bootstrap.sh"
if [ "$MODE" = gpu ]; then
    python -c 'import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())' || {
        echo "the installed llama-cpp-python has no GPU offload: remove $VENV and" \
            "$FLEETBENCH_LLAMA_WHEELS, and run again" >&2
        exit 1
    }
    BINARY="$(LLAMA_GPU_ARCHITECTURES="$ARCH" "$ROOT/scripts/build-llama-tool.sh" --backend cuda)"
    python "$ROOT/bench/gpu_check.py" --binary "$BINARY" --out "$OUT"
else
    BINARY="$("$ROOT/scripts/build-llama-tool.sh")"
    python "$ROOT/bench/gpu_check.py" --binary "$BINARY" --out "$OUT" --cpu-dry-run
fi
