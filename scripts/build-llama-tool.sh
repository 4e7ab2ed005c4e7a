#!/usr/bin/env bash
# Builds a tool of the llama.cpp that the installed llama-cpp-python vendors (its sdist, from
# the package index), once per backend: later calls print the built binary's path.
#   scripts/build-llama-tool.sh                          -> the path of llama-batched-bench
#   scripts/build-llama-tool.sh llama-server             -> the path of llama-server
#   scripts/build-llama-tool.sh --backend cuda [TOOL]    -> built for NVIDIA GPUs (CUDA)
# Backends: cpu (the default), cuda, metal, hip (AMD, ROCm), vulkan. A GPU build needs the
# backend's SDK (nvcc, Xcode, ROCm, the Vulkan SDK); LLAMA_GPU_ARCHITECTURES narrows what it
# compiles for (CUDA: "90" for an H100/H200; HIP: "gfx90a"), the default being the SDK's.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh" >&2

BACKEND=cpu
if [ "${1:-}" = "--backend" ]; then
    BACKEND="${2:?--backend takes cpu, cuda, metal, hip or vulkan}"
    shift 2
fi
TOOL="${1:-llama-batched-bench}"
case "$TOOL" in
    llama-batched-bench | llama-server) ;;
    *) echo "usage: $0 [--backend cpu|cuda|metal|hip|vulkan] [llama-batched-bench|llama-server]" >&2; exit 2 ;;
esac
ARCHS="${LLAMA_GPU_ARCHITECTURES:-}"
case "$BACKEND" in
    cpu) BACKEND_ARGS=() ;;
    cuda) BACKEND_ARGS=(-DGGML_CUDA=ON ${ARCHS:+-DCMAKE_CUDA_ARCHITECTURES=$ARCHS}) ;;
    metal) BACKEND_ARGS=(-DGGML_METAL=ON) ;;
    hip) BACKEND_ARGS=(-DGGML_HIP=ON ${ARCHS:+-DGPU_TARGETS=$ARCHS}) ;;
    vulkan) BACKEND_ARGS=(-DGGML_VULKAN=ON) ;;
    *) echo "unknown backend $BACKEND: cpu, cuda, metal, hip or vulkan" >&2; exit 2 ;;
esac
VERSION="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
HOME_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/llama.cpp-$VERSION"
SOURCE="$HOME_DIR/src/vendor/llama.cpp"
BUILD="build"  # the CPU build keeps the folder it always had; others have one each
[ "$BACKEND" = cpu ] || BUILD="build-$BACKEND${ARCHS:+-${ARCHS// /-}}"
BINARY="$SOURCE/$BUILD/bin/$TOOL"
mkdir -p "$HOME_DIR"
# One build at a time (the test suite's workers may ask together): the others wait for it.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$HOME_DIR/.build.lock"
    flock 9
fi
if [ -x "$BINARY" ]; then
    echo "$BINARY"
    exit 0
fi
echo "building $TOOL of llama-cpp-python $VERSION for $BACKEND (several minutes on 2 cores)" >&2
if [ ! -d "$SOURCE" ]; then
    mkdir -p "$HOME_DIR"
    python -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        ${FLEETBENCH_OFFLINE_WHEELS:+--no-index --find-links "$FLEETBENCH_OFFLINE_WHEELS"} \
        "llama-cpp-python==$VERSION" -d "$HOME_DIR" >&2
    rm -rf "$HOME_DIR/src" && mkdir -p "$HOME_DIR/src"
    tar xzf "$HOME_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$HOME_DIR/src" --strip-components=1
fi
cd "$SOURCE"
# shellcheck disable=SC2086 # CMAKE_ARGS holds several flags (bootstrap.sh sets it on AMX CPUs)
cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_OPENSSL=OFF ${CMAKE_ARGS:-} ${BACKEND_ARGS[@]+"${BACKEND_ARGS[@]}"} >&2
cmake --build "$BUILD" --target "$TOOL" -j "$(getconf _NPROCESSORS_ONLN)" >&2
echo "$BINARY"
