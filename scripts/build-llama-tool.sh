#!/usr/bin/env bash
# Builds a tool of the llama.cpp that the installed llama-cpp-python vendors (its sdist, from
# the package index), once: later calls print the built binary's path.
#   scripts/build-llama-tool.sh                 -> the path of llama-batched-bench
#   scripts/build-llama-tool.sh llama-server    -> the path of llama-server
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh" >&2

TOOL="${1:-llama-batched-bench}"
case "$TOOL" in
    llama-batched-bench | llama-server) ;;
    *) echo "usage: $0 [llama-batched-bench|llama-server]" >&2; exit 2 ;;
esac
VERSION="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
HOME_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/llama.cpp-$VERSION"
SOURCE="$HOME_DIR/src/vendor/llama.cpp"
BINARY="$SOURCE/build/bin/$TOOL"
if [ -x "$BINARY" ]; then
    echo "$BINARY"
    exit 0
fi
echo "building $TOOL of llama-cpp-python $VERSION (several minutes on 2 cores)" >&2
if [ ! -d "$SOURCE" ]; then
    mkdir -p "$HOME_DIR"
    python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$HOME_DIR" >&2
    rm -rf "$HOME_DIR/src" && mkdir -p "$HOME_DIR/src"
    tar xzf "$HOME_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$HOME_DIR/src" --strip-components=1
fi
cd "$SOURCE"
# shellcheck disable=SC2086 # CMAKE_ARGS holds several flags (bootstrap.sh sets it on AMX CPUs)
cmake -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF ${CMAKE_ARGS:-} >&2
cmake --build build --target "$TOOL" -j "$(nproc)" >&2
echo "$BINARY"
