#!/usr/bin/env bash
# The whole test suite on a fresh machine: a venv with runner and its test dependencies, a Chromium
# for the browser tests (Debian's where apt can install it, else playwright's), then pytest.
# Arguments go to pytest. llama-cpp-python builds from source the first time (~8-10 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# The RPC tests need llama-cpp-python built with llama.cpp's RPC backend. pip's wheel cache is keyed
# by the source, not by CMAKE_ARGS: a cached build without RPC is rebuilt, past the cache.
case " ${CMAKE_ARGS:-} " in *GGML_RPC*) ;; *) export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on" ;; esac
.venv/bin/pip install -q -e ".[test]"
if ! .venv/bin/python -c "import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_rpc())"; then
  pinned="$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)"
  # kept by version and CMAKE_ARGS, so the build happens once per machine
  python_tag="$(.venv/bin/python -c 'import sys; print(sys.implementation.cache_tag)')"
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/runner/wheels/$(echo "$pinned $python_tag $CMAKE_ARGS" | sha256sum | cut -c1-16)"
  if ! ls "$wheels"/llama_cpp_python-*.whl > /dev/null 2>&1; then
    echo "scripts/test.sh: building llama-cpp-python with RPC (the cached build has none; ~8-10 min)" >&2
    .venv/bin/pip wheel -q --no-deps --no-cache-dir "$pinned" -w "$wheels"
  fi
  .venv/bin/pip install -q --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
fi
if [ -z "${RUNNER_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get > /dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium > /dev/null
  else
    .venv/bin/python -m playwright install chromium
  fi
fi
exec .venv/bin/python -m pytest "$@"
