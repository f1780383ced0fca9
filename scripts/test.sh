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
  echo "scripts/test.sh: building llama-cpp-python with RPC (the cached build has none)" >&2
  .venv/bin/pip install -q --force-reinstall --no-deps --no-cache-dir "$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)"
fi
if [ -z "${RUNNER_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get > /dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium > /dev/null
  else
    .venv/bin/python -m playwright install chromium
  fi
fi
exec .venv/bin/python -m pytest "$@"
