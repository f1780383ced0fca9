"""uvicorn's Server, made to stop promptly: a shutdown signal cancels every request first."""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType

import uvicorn


class CancellingServer(uvicorn.Server):
    """Without the cancel, uvicorn waits for each open stream to finish generating (minutes)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)
