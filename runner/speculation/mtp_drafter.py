"""Drafting with the target's own multi-token-prediction (MTP) layers (GLM-4.5, DeepSeek-V3, Qwen3.5...).

A second context on the target's model runs only its MTP layers, with a KV of their own and one
sequence per slot: position p takes the token at p together with the target's hidden row at p-1
(fed_drafter.FedDrafter, shift 0). Free order: this context before the target's.
"""

from __future__ import annotations

import numpy as np

from runner.runtime import staging
from runner.runtime.llama import Context, ContextShape
from runner.runtime.model_runner import ModelRunner
from runner.speculation.drafter import register_drafter
from runner.speculation.fed_drafter import FedDrafter


# architectures whose MTP layers this llama.cpp runs and that keep no recurrent state: drafted with by
# default (--spec mtp tries any file with nextn layers)
MTP_BY_DEFAULT = frozenset({"deepseek2", "deepseek32", "glm4moe", "glm-dsa", "mimo2", "step35", "hy_v3", "cohere2moe"})


class MtpDrafter(FedDrafter):
    name = "mtp"

    def __init__(self, target: ModelRunner, shape: ContextShape) -> None:
        staging.require(staging.MTP_CALLS, "MTP drafting")
        model = target.model
        super().__init__(target, Context(model, shape, mtp_of=target.context), shape, model.n_embd_out,
                         model.n_embd_out)

    def taps(self, on: bool) -> None:  # every token's hidden row, prompt chunks included
        self.target.context.capture_hidden(masked=False, on=on)
        self.target.tap = (lambda context, n_tokens: context.hidden(n_tokens)) if on else None

    def inputs(self, slot_id: int, i0: int, i1: int) -> np.ndarray:
        return self.rows.get(slot_id, i0 - 1, i1 - 1)  # (a prompt's first token: zeros)

    def gauges(self) -> dict[str, int]:
        return {"mtp_target_rows_bytes": self.rows.n_bytes}


def _factory(target: ModelRunner, shape: ContextShape, **_: object) -> MtpDrafter:
    return MtpDrafter(target, shape)


register_drafter("mtp", _factory)
