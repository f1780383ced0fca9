"""The Python API (runner.Runner): generate in the caller's thread."""
