"""How many of a model's layers go to the GPU: `--n-gpu-layers auto` places as many as the GPUs'
free memory holds (weights, their layers' KV for every slot, the compute buffer), leaving a margin
on each; a number is taken as asked, but refused when it cannot fit, saying what would.

llama.cpp counts offloaded layers from the top: n_gpu_layers = k puts the output head and the
last k-1 repeating layers on the GPU (k = n_layer + 1: all of them); the token embeddings stay
on the CPU. The context is never shrunk to make room: a plan that cannot hold it says so."""

from __future__ import annotations

from dataclasses import dataclass

from runner.core.errors import MemoryPlanError
from runner.runtime.devices import Device

MARGIN_BYTES = 1 << 30  # left free on each GPU (llama.cpp's own fit keeps 1 GiB too)
_GIB = 1 << 30


def parse_gpu_layers(value: str) -> int | None:
    """--n-gpu-layers: None for auto, else a count (-1: all)."""
    if value == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        count = -2
    if count < -1:
        raise MemoryPlanError(f"--n-gpu-layers must be auto, -1 (all) or a number of layers, got {value!r}")
    return count


@dataclass(frozen=True)
class LayerCosts:
    """What each offloadable part would place on a GPU."""

    layer_weights: tuple[int, ...]  # per repeating layer
    output_weights: int  # the output head
    layer_kv: tuple[int, ...]  # per repeating layer: its KV for every slot (a sliding-window layer's is its window)
    compute: int  # the GPU's compute buffer (there once anything is offloaded)

    @property
    def n_layer(self) -> int:
        return len(self.layer_weights)

    def on_gpu(self, n_gpu_layers: int) -> int:
        """Bytes on the GPUs with llama.cpp's n_gpu_layers (-1: all)."""
        k = self.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, self.n_layer + 1)
        if k <= 0:
            return 0
        n_repeating = k - 1
        weights = self.output_weights + sum(self.layer_weights[self.n_layer - n_repeating:])
        return weights + sum(self.layer_kv[self.n_layer - n_repeating:]) + self.compute

    def most_that_fit(self, room: int) -> int:
        """The largest n_gpu_layers whose bytes fit in `room` (0: none)."""
        return next((k for k in range(self.n_layer + 1, 0, -1) if self.on_gpu(k) <= room), 0)


@dataclass(frozen=True)
class Offload:
    """The plan: how many layers, on which devices, and what they hold."""

    n_gpu_layers: int  # as llama.cpp takes it (0: CPU only)
    n_layer: int
    gpu_bytes: int
    room_bytes: int  # the GPUs' free memory less the margins
    devices: tuple[Device, ...]
    auto: bool

    @property
    def is_offloaded(self) -> bool:
        return self.n_gpu_layers != 0 and bool(self.devices)

    @property
    def all_layers(self) -> bool:
        return self.n_gpu_layers < 0 or self.n_gpu_layers >= self.n_layer + 1

    def as_json(self) -> dict[str, object]:
        """Where the layers are, for /v1/models and runner info."""
        return {"n_gpu_layers": self.n_gpu_layers if self.is_offloaded else 0, "layers": self.n_layer,
                "gpu_bytes": self.gpu_bytes, "devices": [d.name for d in self.devices], "auto": self.auto}

    def describe(self) -> str:
        if not self.devices:
            return "no GPU: every layer on the CPU"
        names = ", ".join(d.describe() for d in self.devices)
        kind = "RPC workers" if all(d.name.startswith("RPC") for d in self.devices) else "GPU"
        if not self.is_offloaded:
            return f"{kind} {names}: no layers offloaded (--n-gpu-layers 0)"
        placed = (f"all {self.n_layer} layers and the output head" if self.all_layers
                  else f"the output head and the last {self.n_gpu_layers - 1} of {self.n_layer} layers "
                       f"(the rest on the CPU)")
        how = "auto: as many as fit" if self.auto else "as asked"
        each = "worker" if kind == "RPC workers" else "GPU"
        return (f"{kind} {names}: {placed}, {self.gpu_bytes / _GIB:.2f} GiB with their KV and compute "
                f"({how}, {MARGIN_BYTES / _GIB:.0f} GiB left free per {each})")


def plan_offload(wanted: int | None, costs: LayerCosts, devices: list[Device], reserved: int = 0) -> Offload:
    """`wanted` layers (None: auto) on the layer devices, `reserved` bytes of them already promised
    (a target model's, when this is its draft)."""
    gpus = tuple(d for d in devices if d.takes_layers)
    room = sum(max(0, d.free_bytes - MARGIN_BYTES) for d in gpus) - reserved
    if not gpus:
        return Offload(0, costs.n_layer, 0, 0, gpus, wanted is None)
    if wanted is None:
        k = costs.most_that_fit(room)
        return Offload(k, costs.n_layer, costs.on_gpu(k), room, gpus, True)
    need = costs.on_gpu(wanted)
    if need > room:
        fits = costs.most_that_fit(room)
        raise MemoryPlanError(
            f"--n-gpu-layers {wanted} needs {need / _GIB:.2f} GiB on the GPU but {max(room, 0) / _GIB:.2f} GiB is free "
            f"there (after a {MARGIN_BYTES / _GIB:.0f} GiB margin): {fits} would fit (--n-gpu-layers auto picks that); "
            "or fewer slots (--parallel), a smaller context (--ctx-size), a quantized KV cache (--kv-type q8_0)")
    return Offload(wanted, costs.n_layer, need, room, gpus, False)
