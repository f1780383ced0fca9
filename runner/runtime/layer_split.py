"""Which device each layer of a model lands on when llama.cpp spreads it over several (RPC workers,
GPUs), computed the way llama.cpp places them, so the memory plan can show every device's share
(weights, KV) before anything loads; and --tensor-split's numbers turned into llama.cpp's params.

llama.cpp offloads the top n_gpu_layers of the n_layer + 1 units (the repeating layers, then the
output head); unit i of those goes to the first device whose cumulative share exceeds
i / n_offloaded, the shares being tensor_split's or, when that is all zeros, each device's free
memory. What is not offloaded (and the token embeddings) stays on this machine's CPU."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from runner.core.errors import OptionError
from runner.runtime.devices import Device
from runner.runtime.gpu_fit import LayerCosts

_MIB = 1 << 20


@dataclass(frozen=True)
class TensorSplit:
    """--tensor-split read: this machine's share of the layers, and each device's after it."""

    local: float
    devices: tuple[float, ...]

    def n_gpu_layers(self, n_layer: int) -> int:
        """Layers llama.cpp offloads (of n_layer + 1 units) so this machine keeps its share."""
        total = self.local + sum(self.devices)
        return round((n_layer + 1) * sum(self.devices) / total)


def parse_tensor_split(text: str, n_devices: int) -> TensorSplit | None:
    """"L,D1,D2,...": shares for this machine and each of the n_devices (None when text is empty)."""
    if not text:
        return None
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError:
        shares = []
    if len(shares) != n_devices + 1 or any(s < 0 for s in shares) or not any(shares[1:]):
        raise OptionError(f"--tensor-split {text!r}: give {n_devices + 1} shares (this machine, then each --rpc "
                          "worker in order), none negative and some for a worker, e.g. "
                          + ",".join(["1"] * (n_devices + 1)))
    return TensorSplit(shares[0], tuple(shares[1:]))


def place_units(n_layer: int, n_gpu_layers: int, shares: list[float]) -> list[int]:
    """The device index of each unit (layers 0..n_layer-1, then the output head); -1: this CPU."""
    n_units = n_layer + 1
    offloaded = n_units if n_gpu_layers < 0 else min(n_gpu_layers, n_units)
    if offloaded <= 0 or not shares:
        return [-1] * n_units
    total, running, bounds = sum(shares), 0.0, []
    for share in shares:
        running += share
        bounds.append(running / total)
    first = n_units - offloaded
    return [-1 if unit < first else min(bisect.bisect_right(bounds, (unit - first) / offloaded), len(shares) - 1)
            for unit in range(n_units)]


@dataclass(frozen=True)
class DeviceShare:
    name: str  # "CPU" for this machine, else llama.cpp's device name (RPC0, CUDA0)
    where: str  # "this machine", or the worker's HOST:PORT / the GPU's description
    layers: tuple[int, ...]  # repeating layers
    has_output: bool
    weights_bytes: int
    kv_bytes: int

    def describe(self) -> str:
        span = f"layers {self.layers[0]}-{self.layers[-1]}" if self.layers else "no layers"
        if not self.layers and not self.has_output:
            return f"{self.name} ({self.where}): {span}" + (f", {self.weights_bytes / _MIB:,.1f} MiB weights (the "
                                                             "token embeddings)" if self.weights_bytes else "")
        head = " and the output head" if self.has_output else ""
        return (f"{self.name} ({self.where}): {span}{head}, {self.weights_bytes / _MIB:,.1f} MiB weights, "
                f"{self.kv_bytes / _MIB:,.1f} MiB KV")


def device_shares(costs: LayerCosts, n_gpu_layers: int, devices: list[Device], shares: list[float] | None,
                  embeddings_bytes: int) -> list[DeviceShare]:
    """Each device's layers and bytes (this machine's CPU first, with the token embeddings)."""
    weights = shares if shares else [float(d.free_bytes) for d in devices]
    placed = place_units(costs.n_layer, n_gpu_layers, weights)
    out = []
    for index, (name, where) in enumerate([("CPU", "this machine")] + [(d.name, d.description) for d in devices]):
        units = [u for u, at in enumerate(placed) if at == index - 1]
        layers = tuple(u for u in units if u < costs.n_layer)
        has_output = costs.n_layer in units
        n_bytes = sum(costs.layer_weights[u] for u in layers) + (costs.output_weights if has_output else 0)
        out.append(DeviceShare(name, where, layers, has_output, n_bytes + (embeddings_bytes if index == 0 else 0),
                               sum(costs.layer_kv[u] for u in layers)))
    return out
