"""How often a draft model's top token is the target's: the acceptance `--spec auto` starts from.

Measured once per pair (cached beside the step costs): one prefill of a fixed text through each
model, every position's argmax compared; it tracks the acceptance on real output closely. Without
it auto starts every draft model at a generic prior, which may never look worth a draft, so
acceptance is never learned.
"""

from __future__ import annotations

import numpy as np

from runner.runtime.llama import Batch, Context

# Written for this purpose: prose, a list and code, the kinds of text a chat model produces.
AGREEMENT_TEXT = (
    "The history of the bicycle begins in the early nineteenth century. Inventors in Germany and France "
    "built wooden machines that riders pushed along with their feet. Pedals came later, fixed to the front "
    "wheel, and by the 1880s the safety bicycle, with two wheels of equal size and a chain drive, had taken "
    "its modern shape. Cheap steel tubing and air-filled tyres made it popular with workers and students.\n\n"
    "To fix a flat tyre:\n1. Remove the wheel.\n2. Find the hole and patch it.\n3. Pump the tyre up again.\n\n"
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
)
N_TOKENS_MIN = 16  # fewer positions than this say too little to replace the generic prior
SEQ_ID = 0  # both contexts are fresh: their first sequence is empty


def _argmax_rows(context: Context, token_ids: list[int]) -> np.ndarray:
    batch = Batch(len(token_ids))
    batch.add(SEQ_ID, token_ids, 0, len(token_ids))
    try:
        return context.decode(batch).argmax(axis=1)
    finally:
        context.kv_remove(SEQ_ID, 0, -1)


def measure_agreement(target: Context, draft: Context) -> float | None:
    """Share of positions of AGREEMENT_TEXT where both models' most likely next token is the
    same (None when the contexts hold too few tokens to tell)."""
    token_ids = target.model.tokenize(AGREEMENT_TEXT, add_special=True, parse_special=False)
    n_fit = min(target.shape.n_ctx_per_seq, draft.shape.n_ctx_per_seq, target.shape.n_ubatch, draft.shape.n_ubatch)
    token_ids = token_ids[:n_fit]
    if len(token_ids) < N_TOKENS_MIN:
        return None
    return float(np.mean(_argmax_rows(target, token_ids) == _argmax_rows(draft, token_ids)))
