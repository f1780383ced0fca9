#!/usr/bin/env bash
# The whole test suite on a fresh machine: a venv with runner and its test dependencies, a Chromium
# for the browser tests (Debian's where apt can install it, else playwright's), then pytest.
# Arguments go to pytest. llama-cpp-python builds from source the first time (~8-10 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e ".[test]"
if [ -z "${RUNNER_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get > /dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium > /dev/null
  else
    .venv/bin/python -m playwright install chromium
  fi
fi
exec .venv/bin/python -m pytest "$@"
