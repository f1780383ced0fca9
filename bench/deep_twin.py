"""A benchmark device: a target model that computes exactly another model's function at several
times its cost, so that a draft model's speed-up can be measured at a realistic cost ratio (a 7B
target with a 0.5B draft costs ~15x per token; SmolLM2 135M drafting for itself costs 1x).

The twin is the F16 model with its blocks repeated K times in all; every added block's output
projections (attn_output, ffn_down) are zero, so it adds nothing to the residual stream: the
logits are the original model's (up to float rounding), while each token pays K times the
layers (weights read, attention, KV). The drafts are the real model's own Q8_0/Q4_0 variants.

    RUNNER_CACHE_DIR=.cache/models python bench/deep_twin.py --copies 4
    RUNNER_CACHE_DIR=.cache/models python bench/speculative.py --target .cache/models/SmolLM2-135M-Instruct.F16.twin4.gguf \\
        --drafts smollm2-135m-instruct:q8_0 smollm2-135m-instruct:q4_0 --spec auto --skip-padded
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path  # noqa: E402

ZEROED = ("attn_output.weight", "ffn_down.weight")  # a block whose outputs are zero adds nothing to the residual


def write_twin(source: Path, out: Path, copies: int) -> Path:
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    n_layer = int(reader.fields[f"{arch}.block_count"].contents())
    writer = gguf.GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value = n_layer * copies if field.name == f"{arch}.block_count" else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    blocks: dict[int, list] = {}
    entries = []  # (name, source tensor, data) in the order they are written
    for tensor in reader.tensors:
        match = re.match(r"blk\.(\d+)\.(.+)", tensor.name)
        if match:
            blocks.setdefault(int(match[1]), []).append((match[2], tensor))
        else:
            entries.append((tensor.name, tensor, tensor.data))
    for copy in range(copies):
        for layer in range(n_layer):
            for suffix, tensor in blocks[layer]:
                data = np.zeros_like(tensor.data) if copy > 0 and suffix in ZEROED else tensor.data
                entries.append((f"blk.{copy * n_layer + layer}.{suffix}", tensor, data))
    for name, tensor, data in entries:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, _, data in entries:
        writer.write_tensor_data(data)
    writer.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default="smollm2-135m-instruct:f16")
    ap.add_argument("--copies", type=int, default=4, help="the twin has this many times the layers")
    args = ap.parse_args()
    source = model_path(args.source)
    out = source.with_name(source.name.removesuffix(".gguf") + f".twin{args.copies}.gguf")
    write_twin(source, out, args.copies)
    print(out)


if __name__ == "__main__":
    main()
