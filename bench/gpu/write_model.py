"""A model with SmolLM2-135M's shapes and random weights, for the device check: a real model's
98 MB file does not fit what travels to the device beside the rest (64 MiB), and for tokens/s and
time to first token side by side (runner and llama-server on the same file) only the shapes matter.
Not for speculation's acceptance: the check measures that on a deep twin of this model instead
(bench/deep_twin.py), labelled as a stand-in.

    python bench/gpu/write_model.py OUT.gguf        (F32; llama-quantize makes the Q4_1/Q8_0/F16 files)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from tiny_gguf import write_tiny_gguf  # noqa: E402

# SmolLM2-135M: 30 layers, 576 wide, 9 heads (3 for K/V), 1536 feed-forward, 49,152 tokens
SMOLLM2_SHAPES = {"n_embd": 576, "n_layer": 30, "n_head": 9, "n_head_kv": 3, "n_ff": 1536, "n_vocab": 49152}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=SMOLLM2_SHAPES["n_layer"])
    args = ap.parse_args()
    shapes = {**SMOLLM2_SHAPES, "n_layer": args.layers}
    write_tiny_gguf(args.out, seed=7, scale=0.02, **shapes)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.0f} MB, SmolLM2-135M's shapes, random weights)")


if __name__ == "__main__":
    main()
