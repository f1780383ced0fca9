"""Before loading: will weights + KV for every slot + compute buffers fit in memory?"""

from __future__ import annotations

import os
from dataclasses import dataclass

from runner.core.errors import MemoryPlanError
from runner.config.options import KV_BYTES_PER_VALUE, N_UBATCH_MAX, EngineOptions
from runner.runtime.gguf_file import GgufInfo
from runner.runtime.gpu_fit import LayerCosts, Offload

_MIB = 1 << 20


def available_ram_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _kv_bytes_per_token(info: GgufInfo, options: EngineOptions) -> float:
    n_embd = info.arch_int("embedding_length", 0)
    n_head = info.arch_int("attention.head_count", 1) or 1
    n_head_kv = info.arch_int("attention.head_count_kv", n_head) or n_head
    head_k = info.arch_int("attention.key_length", n_embd // n_head)
    head_v = info.arch_int("attention.value_length", n_embd // n_head)
    return info.arch_int("block_count", 0) * n_head_kv * (head_k + head_v) * KV_BYTES_PER_VALUE[options.kv_type]


def _compute_bytes(info: GgufInfo, options: EngineOptions) -> int:
    """Logits for every output row + activations of one micro-batch (a generous estimate)."""
    n_embd = info.arch_int("embedding_length", 0)
    n_ff = info.arch_int("feed_forward_length", 4 * n_embd)
    n_ubatch = min(options.batch_size, N_UBATCH_MAX)
    return info.n_vocab * 4 * (options.parallel + n_ubatch) + n_ubatch * (n_embd + n_ff) * 4 * 8 + 32 * _MIB


def layer_costs(info: GgufInfo, options: EngineOptions) -> LayerCosts:
    """What offloading each layer would place on a GPU (gpu_fit's input)."""
    n_layer = info.arch_int("block_count", 0)
    weights = info.layer_weight_bytes or (info.weights_bytes // max(n_layer, 1),) * n_layer
    kv_per_layer = _kv_bytes_per_token(info, options) / max(n_layer, 1) * options.ctx_size * options.parallel
    return LayerCosts(tuple(weights[:n_layer]) + (0,) * (n_layer - len(weights)), info.output_weight_bytes,
                      int(kv_per_layer), _compute_bytes(info, options))


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int
    kv_per_slot_bytes: int
    n_slots: int
    compute_bytes: int
    available_bytes: int
    n_threads: int = 1  # llama.cpp's CPU threads (shown in the plan's line)
    offload: Offload | None = None  # layers on a GPU (their bytes are not in RAM)

    @classmethod
    def for_model(cls, info: GgufInfo, options: EngineOptions, available_bytes: int | None = None,
                  offload: Offload | None = None) -> MemoryPlan:
        return cls(
            weights_bytes=info.weights_bytes,
            kv_per_slot_bytes=int(_kv_bytes_per_token(info, options) * options.ctx_size),
            n_slots=options.parallel,
            compute_bytes=_compute_bytes(info, options),
            available_bytes=available_ram_bytes() if available_bytes is None else available_bytes,
            n_threads=options.threads,
            offload=offload,
        )

    def with_draft(self, draft: MemoryPlan) -> MemoryPlan:
        """Target and draft model together (the draft keeps one KV sequence per slot too)."""
        return MemoryPlan(self.weights_bytes + draft.weights_bytes, self.kv_per_slot_bytes + draft.kv_per_slot_bytes,
                          self.n_slots, self.compute_bytes + draft.compute_bytes, self.available_bytes, self.n_threads,
                          _both(self.offload, draft.offload))

    @property
    def total_bytes(self) -> int:
        """Weights, KV and compute, wherever they are."""
        return self.weights_bytes + self.kv_per_slot_bytes * self.n_slots + self.compute_bytes

    @property
    def gpu_bytes(self) -> int:
        return self.offload.gpu_bytes if self.offload is not None else 0

    @property
    def ram_bytes(self) -> int:
        """What stays in RAM: all but what went to a GPU (the CPU keeps a compute buffer of its own)."""
        if not self.gpu_bytes:
            return self.total_bytes
        return self.total_bytes - self.gpu_bytes + self.compute_bytes

    @property
    def fits(self) -> bool:
        return self.ram_bytes <= self.available_bytes

    def describe(self) -> str:
        mib = lambda n: f"{n / _MIB:,.0f} MiB"  # noqa: E731
        line = (
            f"memory plan ({self.n_threads} threads): weights {mib(self.weights_bytes)} + KV {mib(self.kv_per_slot_bytes)}/slot x {self.n_slots} "
            f"slots + compute ~{mib(self.compute_bytes)} = {mib(self.total_bytes)}"
        )
        if self.offload is not None and self.offload.devices:
            line += f"; {self.offload.describe()}; in RAM {mib(self.ram_bytes)}"
        return line + f" (available: {mib(self.available_bytes)})"

    def check(self) -> None:
        if not self.fits:
            raise MemoryPlanError(
                f"not enough memory: {self.describe()}; try fewer slots (--parallel), "
                f"a smaller context (--ctx-size), a quantized KV cache (--kv-type q8_0), or a smaller model"
            )


def _both(target: Offload | None, draft: Offload | None) -> Offload | None:
    """A target's and its draft's offload as one (the draft's layers on the same GPUs)."""
    if target is None or draft is None:
        return target or draft
    return Offload(target.n_gpu_layers, target.n_layer, target.gpu_bytes + draft.gpu_bytes, target.room_bytes,
                   target.devices, target.auto)
