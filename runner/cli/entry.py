"""The `runner` command's entry point: the CLI, with a Ctrl-C while its modules still import ending
as quietly as one later on (exit 130, no traceback)."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from runner.cli.main import main as run_cli
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return run_cli()
