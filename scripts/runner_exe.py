"""The executable's entry point: the same `runner` CLI (no arguments: serve and open the chat)."""

import sys

from runner.cli.entry import main

sys.exit(main())
