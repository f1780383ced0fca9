"""The compute devices llama.cpp sees (ggml's device registry), as plain data: what each is and
how much memory it has free. `runtime.llama.list_devices()` reads them."""

from __future__ import annotations

from dataclasses import dataclass

_GIB = 1 << 30
KINDS = ("cpu", "gpu", "igpu", "accel", "meta")  # ggml_backend_dev_type, in its order


@dataclass(frozen=True)
class Device:
    name: str  # ggml's name: CPU, CUDA0, Metal, ...
    description: str  # e.g. "NVIDIA H200"
    kind: str  # one of KINDS
    free_bytes: int
    total_bytes: int

    @property
    def takes_layers(self) -> bool:
        """A device llama.cpp offloads layers to (a GPU, dedicated or integrated)."""
        return self.kind in ("gpu", "igpu")

    def describe(self) -> str:
        return (f"{self.name} ({self.description}, {self.kind}): {self.free_bytes / _GIB:.1f} GiB free of "
                f"{self.total_bytes / _GIB:.1f} GiB")


def layer_devices(devices: list[Device]) -> list[Device]:
    """The devices layers may go to (llama.cpp spreads them over several GPUs by free memory)."""
    return [d for d in devices if d.takes_layers]
