"""What a drafting step of MTP and EAGLE3 costs against a target step, at 1 and 4 slots: the decode
costs --spec auto's calibration measures (runtime/calibration.measure) on the target's context and
on the drafter's, side by side in one run.

No trained MTP model or EAGLE3 head can be downloaded here, so both are written with random
weights at real shapes (their cost does not depend on the weights' values):
- EAGLE3: a one-layer head for SmolLM2-135M (F16 target: 30 layers, 576 wide), tapping the inputs of
  layers 2, 15 and 27, borrowing the target's token embeddings and output head (49,152 tokens);
- MTP: a glm4moe of SmolLM2's width (F32) with --mtp-trunk dense layers and one MoE MTP layer.

A trained head's speed-up cannot be shown on random weights (they are never accepted). On a
machine that has a real MTP model or EAGLE3 head, bench/speculative_http.py measures it through
the server: `--model MODEL.gguf --draft mtp` or `--model TARGET.gguf --draft HEAD.gguf`.

    RUNNER_CACHE_DIR=.cache/models python bench/drafting_cost.py [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import model_path, print_table  # noqa: E402
from tiny_eagle3 import write_tiny_eagle3_gguf  # noqa: E402
from tiny_mtp import write_tiny_mtp_gguf  # noqa: E402

from runner.config.options import EngineOptions, physical_cores  # noqa: E402
from runner.model.loaded_model import LoadedModel  # noqa: E402
from runner.runtime.calibration import measure  # noqa: E402
from runner.runtime.gguf_file import read_gguf  # noqa: E402
from runner.runtime.llama import in_scratch_thread  # noqa: E402

WORK = Path(".cache/bench/drafting")


def models(n_trunk: int) -> dict[str, tuple[Path, dict]]:
    """kind -> (target, the options that make it draft with that kind)."""
    WORK.mkdir(parents=True, exist_ok=True)
    target = model_path("smollm2-135m-instruct:f16")
    info = read_gguf(target)
    n_embd, n_layer = info.arch_int("embedding_length", 576), info.arch_int("block_count", 30)
    head = WORK / "eagle3-smollm2-random.gguf"
    if not head.exists():
        write_tiny_eagle3_gguf(head, target_layers=(2, n_layer // 2, n_layer - 3), n_embd_target=n_embd, n_embd=n_embd,
                               n_head=info.arch_int("attention.head_count", 9), n_head_kv=info.arch_int("attention.head_count_kv", 3),
                               n_ff=info.arch_int("feed_forward_length", 1536), scale=0.02, vocab_of=target)
    mtp = WORK / f"glm4moe-{n_trunk}-mtp-random.gguf"
    if not mtp.exists():
        write_tiny_mtp_gguf(mtp, n_embd=n_embd, n_head=9, n_head_kv=3, n_ff=1536, n_ff_exp=512, n_trunk=n_trunk, scale=0.02)
    return {"eagle3": (target, {"spec": "eagle3", "draft": str(head)}), "mtp": (mtp, {"spec": "mtp"})}


def seconds(tables: dict, n_seqs: int, n_each: int) -> float:
    table = tables[str(n_seqs)]
    return table["seconds"][table["sizes"].index(n_each)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--mtp-trunk", type=int, default=12, help="dense layers under the synthetic MTP model's MTP layer")
    args = ap.parse_args()
    rows = []
    for kind, (target, options) in models(args.mtp_trunk).items():
        loaded = LoadedModel(target, EngineOptions(parallel=4, ctx_size=512, threads=args.threads, **options),
                             log=lambda _: None)
        try:
            assert loaded.speculator is not None
            target_costs = in_scratch_thread(lambda: measure(loaded.runner.context))
            draft_costs = in_scratch_thread(lambda: measure(loaded.speculator.drafter.context))
        finally:
            loaded.close()
        for n_seqs in (1, 4):
            step = seconds(target_costs, n_seqs, 1)
            verify = seconds(target_costs, n_seqs, 4)
            draft = seconds(draft_costs, n_seqs, 1)
            rows.append([kind, target.name, n_seqs, f"{step * 1000:.2f}", f"{verify * 1000:.2f}", f"{draft * 1000:.2f}",
                         f"{draft / step:.3f}", f"{(verify + 3 * draft) / step:.2f}"])
    print_table(["drafter", "target", "slots", "target step ms (1 token each)", "verify step ms (4 each)",
                 "draft decode ms (1 each)", "draft / target step", "k=3 step / plain step"], rows)


if __name__ == "__main__":
    main()
