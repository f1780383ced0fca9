#!/usr/bin/env bash
# Build dist/runner: one file carrying the default model (smollm2-135m-instruct).
# Usage: scripts/build_exe.sh [python]   (default: .venv/bin/python; needs `pip install pyinstaller`)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
MODEL="$("$PY" -c 'from runner.catalog.pull import pull; from runner.catalog.store import ModelStore; s = ModelStore(); print(pull(s.catalog.resolve(s.catalog.default), s))')"
exec "$PY" -m runner bundle "$MODEL" -o dist/runner
