"""gemma-3-270m cut to two of its layers: the real tokenizer, 32k context and weights (and so the
same chat template runner gives gemma), with one sliding-window and one full-attention layer.

For tests whose point is what a long prompt does on the way through (rendering, tokenizing, a 32k
slot, the stream's shape), not what the model answers: Claude Code's 20k-token request takes 16 s,
not 82 (the output head is whole, and at that length the full-attention layers' share dominates:
one layer of three). Served by its path, it has no catalog entry, so no draft model.

The kept layers are the real model's layer 0 (sliding window) and layer 5 (its first
full-attention layer: gemma 3 makes every sixth one global); a window pattern of 2 gives the cut
model the same kinds in that order.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import gguf

KEPT_LAYERS = (0, 5)
WINDOW_PATTERN = 2  # llama.cpp: layer i slides unless i % pattern == pattern - 1


def shallow_gemma(source: Path, cache: Path) -> Path:
    """The cut model, written once into a folder of the cache that no model listing reads (reading
    the source's 262k-token vocabulary takes ~10 s); its name carries this file's hash, so a
    changed writer writes it again, and removes the one (192 MB) an older writer left."""
    digest = hashlib.sha256(Path(__file__).read_bytes() + source.name.encode()).hexdigest()[:12]
    out = cache / "derived" / f"gemma-3-270m-2-layers-{digest}.gguf"
    if not out.exists():
        out.parent.mkdir(exist_ok=True)
        partial = out.with_suffix(".partial")
        write_shallow_gemma(source, partial)
        partial.rename(out)
        for stale in out.parent.glob("gemma-3-270m-2-layers-*"):
            if stale != out:
                stale.unlink()
    return out


def write_shallow_gemma(source: Path, out: Path) -> Path:
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value = len(KEPT_LAYERS) if field.name == f"{arch}.block_count" else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    writer.add_uint32(f"{arch}.attention.sliding_window_pattern", WINDOW_PATTERN)
    entries = []  # (name, source tensor), in the order they are written
    for tensor in reader.tensors:
        block = re.match(r"blk\.(\d+)\.(.+)", tensor.name)
        if block is None:
            entries.append((tensor.name, tensor))
        elif int(block[1]) in KEPT_LAYERS:
            entries.append((f"blk.{KEPT_LAYERS.index(int(block[1]))}.{block[2]}", tensor))
    for name, tensor in entries:
        writer.add_tensor_info(name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, tensor in entries:
        writer.write_tensor_data(tensor.data)
    writer.close()
    return out
