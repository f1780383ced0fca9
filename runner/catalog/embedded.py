"""The model a one-file executable carries (PyInstaller unpacks it under sys._MEIPASS/models)."""

from __future__ import annotations

import sys
from pathlib import Path

EMBEDDED_DIR = "models"


def is_frozen() -> bool:
    """Running inside the PyInstaller executable?"""
    return bool(getattr(sys, "frozen", False)) and hasattr(sys, "_MEIPASS")


def embedded_model() -> Path | None:
    """The GGUF carried inside the executable (None when running from Python)."""
    if not is_frozen():
        return None
    found = sorted((Path(sys._MEIPASS) / EMBEDDED_DIR).glob("*.gguf"))  # type: ignore[attr-defined]
    return found[0] if found else None


def embedded_name(names_and_files: dict[str, str]) -> str | None:
    """The carried model's catalog name (given each catalog name's file), else its path; None: none carried."""
    model = embedded_model()
    if model is None:
        return None
    return next((n for n, file in names_and_files.items() if file == model.name), str(model))
