#!/usr/bin/env bash
# Builds llama-batched-bench from the llama.cpp that the installed llama-cpp-python vendors
# (its sdist, from the package index), once: later calls print the built binary's path.
#   scripts/build-batched-bench.sh    -> prints the path of llama-batched-bench
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh" >&2

VERSION="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
HOME_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/llama.cpp-$VERSION"
BINARY="$HOME_DIR/src/vendor/llama.cpp/build/bin/llama-batched-bench"
if [ -x "$BINARY" ]; then
    echo "$BINARY"
    exit 0
fi
echo "building llama-batched-bench of llama-cpp-python $VERSION (several minutes on 2 cores)" >&2
mkdir -p "$HOME_DIR"
python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$HOME_DIR" >&2
rm -rf "$HOME_DIR/src" && mkdir -p "$HOME_DIR/src"
tar xzf "$HOME_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$HOME_DIR/src" --strip-components=1
cd "$HOME_DIR/src/vendor/llama.cpp"
# shellcheck disable=SC2086 # CMAKE_ARGS holds several flags (bootstrap.sh sets it on AMX CPUs)
cmake -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF ${CMAKE_ARGS:-} >&2
cmake --build build --target llama-batched-bench -j "$(nproc)" >&2
echo "$BINARY"
