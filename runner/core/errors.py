"""Errors that reach a user as one readable line (CLI) or an OpenAI error body (server)."""

from __future__ import annotations


class RunnerError(Exception):
    """Base for errors whose message is meant for the user as-is."""

    unavailable = False  # what it needs is not there now (an RPC worker down): the same request may work later


class ModelFileError(RunnerError):
    """A model file is missing, not a GGUF, or truncated/corrupt."""


class ModelLoadError(RunnerError):
    """llama.cpp refused to load a model or create a context."""


class CatalogError(RunnerError):
    """Unknown catalog name or a malformed catalog entry."""


class PullError(RunnerError):
    """A model could not be fetched, assembled or verified."""


class MemoryPlanError(RunnerError):
    """The requested slots and context will not fit in memory."""


class OptionError(RunnerError):
    """Engine options that cannot go together."""


class InputError(RunnerError, ValueError):
    """An input a caller gave that cannot be used (an empty text to embed, one too long): a ValueError
    to Python callers, one line to the command line's user."""
