#!/usr/bin/env bash
# Build llama.cpp's own server from the llama.cpp vendored in the llama-cpp-python we pin, so that
# bench/vs_llama_server.py compares against the same kernels runner runs on. CPU build, native
# instructions, as pip builds llama-cpp-python here. About 15-25 minutes on 2 cores.
#
#   bash bench/build_llama_server.sh [OUT_DIR]      (default: .cache/llama-server)
#
# Prints the path of the llama-server binary on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.cache/llama-server}"
python="${PYTHON:-.venv/bin/python}"
version="$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
src="$out/llama_cpp_python-$version"
mkdir -p "$out"
if [ ! -d "$src" ]; then
  "$python" -m pip download --quiet --no-binary :all: --no-deps -d "$out" "llama-cpp-python==$version"
  tar -xzf "$out/llama_cpp_python-$version.tar.gz" -C "$out"
fi
cd "$src/vendor/llama.cpp"
if [ ! -f build/CMakeCache.txt ]; then
  cmake -B build -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON \
    -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build build --target llama-server -j "$(nproc)" > /dev/null
echo "$(pwd)/build/bin/llama-server"
