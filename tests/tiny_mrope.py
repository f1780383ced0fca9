"""Write a tiny random-weight M-RoPE pair: a `qwen2vl` text model (4 position sections per token;
text alone behaves as ordinary RoPE) and its `qwen2vl_merger` vision projector (one ViT block 32
wide, 2x2 patches merged into one embedding of the text model's width). A 40x30 image is 12
tokens but advances positions by 4: every image cell sits at the span's first position, and the
text after it continues at that position + 4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

from tiny_gguf import MERGES, SPECIALS, add_shape, add_vocab, byte_level_alphabet

VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>"]  # what libmtmd puts around a Qwen2-VL image


def write_tiny_qwen2vl(path: Path, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                       n_ff: int = 128, scale: float = 0.3) -> Path:
    rng = np.random.default_rng(seed)
    tokens = SPECIALS + VISION_SPECIALS + byte_level_alphabet() + ["".join(m) for m in MERGES]
    types = [TokenType.CONTROL] * (len(SPECIALS) + 2) + [TokenType.NORMAL] * (len(tokens) - len(SPECIALS) - 2)
    n_kv = n_head_kv * (n_embd // n_head)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "qwen2vl")
    w.add_name("tiny-random-qwen2vl")
    w.add_file_type(0)
    add_shape(w, 2, n_embd, n_ff, n_head, n_head_kv, eps=1e-6)
    w.add_rope_dimension_sections([2, 3, 3, 0])  # (time, height, width, unused): within head_dim / 2
    w.add_rope_freq_base(1000000.0)
    w.add_vocab_size(len(tokens))
    add_vocab(w, tokens, types)

    def tensor(name: str, *shape: int, s: float = scale) -> None:  # numpy order: ggml's ne reversed
        w.add_tensor(name, (rng.standard_normal(shape) * s).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    tensor("token_embd.weight", len(tokens), n_embd, s=1.0)
    ones("output_norm.weight", n_embd)
    tensor("output.weight", len(tokens), n_embd, s=1.0)
    for i in range(2):
        ones(f"blk.{i}.attn_norm.weight", n_embd)
        tensor(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        tensor(f"blk.{i}.attn_k.weight", n_kv, n_embd)
        tensor(f"blk.{i}.attn_v.weight", n_kv, n_embd)
        tensor(f"blk.{i}.attn_q.bias", n_embd, s=0.1)
        tensor(f"blk.{i}.attn_k.bias", n_kv, s=0.1)
        tensor(f"blk.{i}.attn_v.bias", n_kv, s=0.1)
        tensor(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        ones(f"blk.{i}.ffn_norm.weight", n_embd)
        tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_qwen2vl_mmproj(path: Path, n_embd_text: int = 64, seed: int = 0, n_embd: int = 32, n_head: int = 2,
                              n_ff: int = 64, patch: int = 14, scale: float = 0.2) -> Path:
    rng = np.random.default_rng(seed)
    hidden = 4 * n_embd  # the merger reads 2x2 patches side by side
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "qwen2vl_merger")
    for key, value in (("embedding_length", n_embd), ("attention.head_count", n_head), ("feed_forward_length", n_ff),
                       ("block_count", 1), ("projection_dim", n_embd_text), ("image_size", 560), ("patch_size", patch),
                       ("spatial_merge_size", 2)):
        w.add_uint32(f"clip.vision.{key}", value)  # (libmtmd reads these as UINT32 only)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])

    def tensor(name: str, *shape: int, s: float = scale) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * s).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    tensor("v.patch_embd.weight", n_embd, 3, patch, patch)  # Qwen2-VL's Conv3d as its two time halves
    tensor("v.patch_embd.weight.1", n_embd, 3, patch, patch)
    ones("v.blk.0.ln1.weight", n_embd)
    tensor("v.blk.0.ln1.bias", n_embd, s=0.02)
    for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensor(f"v.blk.0.{part}.weight", n_embd, n_embd)
        tensor(f"v.blk.0.{part}.bias", n_embd, s=0.02)
    ones("v.blk.0.ln2.weight", n_embd)
    tensor("v.blk.0.ln2.bias", n_embd, s=0.02)
    tensor("v.blk.0.ffn_up.weight", n_ff, n_embd)
    tensor("v.blk.0.ffn_up.bias", n_ff, s=0.02)
    tensor("v.blk.0.ffn_down.weight", n_embd, n_ff)
    tensor("v.blk.0.ffn_down.bias", n_embd, s=0.02)
    ones("v.post_ln.weight", n_embd)
    tensor("v.post_ln.bias", n_embd, s=0.02)
    tensor("mm.0.weight", hidden, hidden)
    tensor("mm.0.bias", hidden, s=0.02)
    tensor("mm.2.weight", n_embd_text, hidden)
    tensor("mm.2.bias", n_embd_text, s=0.02)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
