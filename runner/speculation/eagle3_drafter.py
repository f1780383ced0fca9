"""Drafting with an EAGLE3 head: a one-layer draft model (GGUF architecture `eagle3`) that reads the
inputs of three of the target's layers, fused by its `fc` (an encode), beside each token.

The target's three layer inputs are tapped on every decode (prompt chunks included) and kept per
position; position p of the head's KV takes token p+1 with the fused features of token p
(fed_drafter.FedDrafter, shift 1). A head without token embeddings or an output head borrows the
target's (llama.cpp does, through the context's `ctx_other`). Free order: the head's context and
model before the target's.
"""

from __future__ import annotations

import numpy as np

from runner.core.errors import ModelLoadError
from runner.runtime import staging
from runner.runtime.llama import Context, ContextShape, Model
from runner.runtime.model_runner import ModelRunner
from runner.speculation.drafter import register_drafter
from runner.speculation.fed_drafter import FedDrafter


# targets whose graphs give their layers' inputs (llama.cpp's t_layer_inp): an EAGLE3 head can read no other
TAPPED_ARCHITECTURES = frozenset({
    "llama", "qwen3", "qwen3moe", "gpt-oss", "gemma4", "lfm2", "minimax-01", "minimax-m2", "muse-glimmer",
    "nanbeige", "hunyuan_vl", "mimo2", "bailingmoe3", "deepseek4", "nemotron_h", "qwen35", "qwen35moe",
    "qwen3next", "qwen4exp"})


class Eagle3Drafter(FedDrafter):
    name = "eagle3"
    shift = 1
    all_logits = True  # (the head's graph computes every row's logits: llama.cpp hands back the first ones)

    def __init__(self, target: ModelRunner, model: Model, shape: ContextShape) -> None:
        staging.require(staging.EAGLE3_CALLS, "EAGLE3 drafting")
        self.model = model
        layers = model.target_layer_ids()
        n_layer, name = target.model.n_layer, target.model.path.name
        if target.model.architecture not in TAPPED_ARCHITECTURES:
            raise ModelLoadError(f"an EAGLE3 head cannot draft for {name}: llama.cpp gives no layer inputs of a "
                                 f"{target.model.architecture} model")
        if len(layers) != 3 or not all(0 <= lid < n_layer for lid in layers):
            raise ModelLoadError(f"the EAGLE3 head {model.path.name} reads layers {layers} of its target; "
                                 f"{name} has {n_layer}: it is not this model's head")
        width = int(model.meta("eagle3.target_hidden_size") or 0)
        if width != target.model.n_embd:
            raise ModelLoadError(f"the EAGLE3 head {model.path.name} reads rows {width} wide; {name}'s are "
                                 f"{target.model.n_embd}: it is not this model's head")
        self.layers = layers
        self.target = target
        super().__init__(target, Context(model, shape, other=target.context), shape, 3 * target.model.n_embd,
                         model.n_embd)

    def taps(self, on: bool) -> None:
        for lid in self.layers:
            self.target.context.capture_layer_input(lid, on=on)
        self.target.tap = self._tap if on else None

    def _tap(self, context: Context, n_tokens: int) -> np.ndarray:
        return np.hstack([context.layer_input(lid, n_tokens) for lid in self.layers])

    def inputs(self, slot_id: int, i0: int, i1: int) -> np.ndarray:
        return self.context.encode(self.rows.get(slot_id, i0 - 1, i1 - 1))

    def inputs_of(self, spans: list[tuple[int, int, int]]) -> list[np.ndarray]:
        """Every drafting slot's features fused in one pass of the head's fc."""
        if not spans:
            return []
        fused = self.context.encode(np.vstack([self.rows.get(slot, i0 - 1, i1 - 1) for slot, i0, i1 in spans]))
        bounds = np.cumsum([i1 - i0 for _, i0, i1 in spans])[:-1]
        return np.split(fused, bounds)

    def gauges(self) -> dict[str, int]:
        return {"eagle3_target_rows_bytes": self.rows.n_bytes}

    def close(self) -> None:
        super().close()
        self.model.close()


def is_eagle3_head(architecture: str) -> bool:
    return architecture == "eagle3"


def _factory(target: ModelRunner, model: Model, shape: ContextShape, **_: object) -> Eagle3Drafter:
    return Eagle3Drafter(target, model, shape)


register_drafter("eagle3", _factory)
