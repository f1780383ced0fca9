"""runner: a portable local LLM runner on llama.cpp."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Runner", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `runner --version` and `runner list` do not load llama.cpp.
    if name == "Runner":
        from runner.python_api.runner import Runner

        return Runner
    raise AttributeError(name)
