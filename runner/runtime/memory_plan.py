"""Before loading: will weights + KV for every slot + compute buffers fit in memory?"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from runner.core.errors import MemoryPlanError
from runner.config.options import KV_BYTES_PER_VALUE, N_UBATCH_MAX, EngineOptions, micro_batch_max
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


# The architectures whose sliding-window layout is known here: llama.cpp's default pattern for each
# (layer i slides unless i % n == n - 1; its load_swa_pattern), which a pattern the GGUF states
# overrides. A model of another architecture with a window is planned as if every layer kept the
# whole context, with no checkpoint: an overestimate but for contexts under about twice its window
# (llama.cpp may not even read the key: phi3's loader turns the window off).
DEFAULT_WINDOW_PATTERNS = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2}
_WINDOW_PAD = 256  # llama.cpp pads a sliding-window cache to a multiple of this many cells


def window_flags(info: GgufInfo) -> tuple[bool, ...] | None:
    """Per layer, whether it attends only a sliding window (all False: no window); None where
    the model has a window but its layout is not known here."""
    n_layer = info.arch_int("block_count", 0)
    if not info.arch_int("attention.sliding_window", 0):
        return (False,) * n_layer
    if info.architecture not in DEFAULT_WINDOW_PATTERNS:
        return None
    pattern = info.arch_value("attention.sliding_window_pattern")
    if isinstance(pattern, tuple):  # one flag per layer
        return tuple(bool(f) for f in pattern[:n_layer]) + (False,) * (n_layer - len(pattern))
    if not isinstance(pattern, int) or isinstance(pattern, bool):
        pattern = DEFAULT_WINDOW_PATTERNS[info.architecture]
    return tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(n_layer))


def window_layers(info: GgufInfo) -> int:
    """How many layers attend only a sliding window (0: none, or the layout is not known)."""
    return sum(window_flags(info) or ())


def window_cells(info: GgufInfo, options: EngineOptions) -> int:
    """A slot's cells in each sliding-window layer when only the window is kept (swa_full off):
    the window and a micro-batch, padded as llama.cpp pads them."""
    n_swa = info.arch_int("attention.sliding_window", 0)
    cells = min(options.ctx_size, n_swa + min(options.batch_size, micro_batch_max(options)))
    return -(-cells // _WINDOW_PAD) * _WINDOW_PAD


def _kv_bytes_per_cell_layer(info: GgufInfo, options: EngineOptions) -> int:
    n_embd = info.arch_int("embedding_length", 0)
    n_head = info.arch_int("attention.head_count", 1) or 1
    n_head_kv = info.arch_int("attention.head_count_kv", n_head) or n_head
    head_k = info.arch_int("attention.key_length", n_embd // n_head)
    head_v = info.arch_int("attention.value_length", n_embd // n_head)
    return int(n_head_kv * (head_k + head_v) * KV_BYTES_PER_VALUE[options.kv_type])


def _layer_kv_per_slot(info: GgufInfo, options: EngineOptions) -> tuple[int, ...]:
    """One slot's KV in each layer: the whole context, but in a sliding-window layer (swa_full
    off) only its window."""
    n_layer = info.arch_int("block_count", 0)
    flags = window_flags(info) if options.swa_full == "off" else None
    whole = options.ctx_size * _kv_bytes_per_cell_layer(info, options)
    window = window_cells(info, options) * _kv_bytes_per_cell_layer(info, options)
    return tuple(window if flags and flags[i] else whole for i in range(n_layer))


def _checkpoint_bytes_per_slot(info: GgufInfo, options: EngineOptions) -> int:
    """The host copy of a slot's sliding-window KV kept at its last prompt's end (at most the
    whole window: ModelRunner.checkpoint); none when the window layers keep the whole context or
    none are known."""
    if options.swa_full != "off":
        return 0
    return _kv_bytes_per_cell_layer(info, options) * window_layers(info) * window_cells(info, options)


def draft_options(options: EngineOptions) -> EngineOptions:
    """A draft model's options: its context keeps sliding-window layers whole (LoadedModel gives
    drafters swa_full on: their catch-up reuses a prefix without asking the window)."""
    return dataclasses.replace(options, swa_full="on")


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
    return LayerCosts(tuple(weights[:n_layer]) + (0,) * (n_layer - len(weights)), info.output_weight_bytes,
                      tuple(kv * options.parallel for kv in _layer_kv_per_slot(info, options)),
                      _compute_bytes(info, options))


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int
    kv_per_slot_bytes: int
    n_slots: int
    compute_bytes: int
    available_bytes: int
    n_threads: int = 1  # llama.cpp's CPU threads (shown in the plan's line)
    offload: Offload | None = None  # layers on a GPU (their bytes are not in RAM)
    checkpoint_per_slot_bytes: int = 0  # a slot's sliding-window checkpoint, always in RAM
    ngram_store_bytes: int = 0  # the n-gram store learned across requests (--draft ngram), in RAM

    @classmethod
    def for_model(cls, info: GgufInfo, options: EngineOptions, available_bytes: int | None = None,
                  offload: Offload | None = None) -> MemoryPlan:
        return cls(
            weights_bytes=info.weights_bytes,
            kv_per_slot_bytes=sum(_layer_kv_per_slot(info, options)),
            n_slots=options.parallel,
            compute_bytes=_compute_bytes(info, options),
            available_bytes=available_ram_bytes() if available_bytes is None else available_bytes,
            n_threads=options.threads,
            offload=offload,
            checkpoint_per_slot_bytes=_checkpoint_bytes_per_slot(info, options),
            ngram_store_bytes=options.ngram_store_mb * _MIB if options.draft == "ngram" else 0,
        )

    @classmethod
    def for_draft(cls, info: GgufInfo, options: EngineOptions, offload: Offload | None = None) -> MemoryPlan:
        """A draft model's plan: its layers keep the whole context (draft_options), no checkpoints."""
        return cls.for_model(info, draft_options(options), offload=offload)

    def with_draft(self, draft: MemoryPlan) -> MemoryPlan:
        """Target and draft model together (the draft keeps one KV sequence per slot too)."""
        return MemoryPlan(self.weights_bytes + draft.weights_bytes, self.kv_per_slot_bytes + draft.kv_per_slot_bytes,
                          self.n_slots, self.compute_bytes + draft.compute_bytes, self.available_bytes, self.n_threads,
                          _both(self.offload, draft.offload),
                          self.checkpoint_per_slot_bytes + draft.checkpoint_per_slot_bytes, self.ngram_store_bytes)

    @property
    def total_bytes(self) -> int:
        """Weights, KV, checkpoints and compute, wherever they are."""
        return (self.weights_bytes + (self.kv_per_slot_bytes + self.checkpoint_per_slot_bytes) * self.n_slots
                + self.compute_bytes + self.ngram_store_bytes)

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
            f"memory plan ({self.n_threads} threads): weights {mib(self.weights_bytes)} + KV {mib(self.kv_per_slot_bytes)}/slot"
            + (f" (+ window checkpoint {mib(self.checkpoint_per_slot_bytes)})" if self.checkpoint_per_slot_bytes else "")
            + f" x {self.n_slots} slots + compute ~{mib(self.compute_bytes)}"
            + (f" + n-gram store {mib(self.ngram_store_bytes)}" if self.ngram_store_bytes else "")
            + f" = {mib(self.total_bytes)}"
        )
        if self.offload is not None and self.offload.devices:
            line += f"; {self.offload.describe()}; in RAM {mib(self.ram_bytes)}"
        return line + f" (available: {mib(self.available_bytes)})"

    def check(self) -> None:
        if not self.fits:
            raise MemoryPlanError(
                f"not enough memory: {self.describe()}; try fewer slots (--parallel), "
                f"a smaller context (--ctx-size), a quantized KV cache (--kv-type q8_0), or a smaller model"
                + (" or n-gram store (--ngram-store-mb)" if self.ngram_store_bytes else "")
            )


def _both(target: Offload | None, draft: Offload | None) -> Offload | None:
    """A target's and its draft's offload as one (the draft's layers on the same GPUs)."""
    if target is None or draft is None:
        return target or draft
    return Offload(target.n_gpu_layers, target.n_layer, target.gpu_bytes + draft.gpu_bytes, target.room_bytes,
                   target.devices, target.auto)
