"""Write a tiny random-weight vision projector GGUF (arch `clip`, LLaVA's `mlp` projector) for image tests.

A 28x28 image in 14x14 patches: every image becomes 4 embeddings of the text model's width."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

IMAGE_SIZE, PATCH_SIZE = 28, 14
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2


def write_tiny_mmproj(path: Path, n_embd_text: int = 64, seed: int = 0, n_embd: int = 32, n_ff: int = 64,
                      n_block: int = 1, n_head: int = 2, projection_dim: int = 48, image_size: int = IMAGE_SIZE,
                      patch_size: int = PATCH_SIZE) -> Path:
    """n_embd_text must be the text model's embedding width (the projector's output rows are its inputs).
    The sizes default to tiny; bench/images.py asks for an encoder of a real one's size."""
    rng = np.random.default_rng(seed)
    n_patches = (image_size // patch_size) ** 2
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-random-mmproj")
    w.add_file_type(0)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", n_block)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def tensor(name: str, *shape: int, scale: float = 0.2) -> None:  # numpy order: ggml's ne reversed
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    tensor("v.patch_embd.weight", n_embd, 3, patch_size, patch_size)
    tensor("v.position_embd.weight", n_patches, n_embd)
    for i in range(n_block):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(f"v.blk.{i}.{part}.weight", n_embd, n_embd)
            tensor(f"v.blk.{i}.{part}.bias", n_embd)
        for norm in ("ln1", "ln2"):
            ones(f"v.blk.{i}.{norm}.weight", n_embd)
            tensor(f"v.blk.{i}.{norm}.bias", n_embd)
        tensor(f"v.blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"v.blk.{i}.ffn_up.bias", n_ff)
        tensor(f"v.blk.{i}.ffn_down.weight", n_embd, n_ff)
        tensor(f"v.blk.{i}.ffn_down.bias", n_embd)
    tensor("mm.0.weight", projection_dim, n_embd)
    tensor("mm.0.bias", projection_dim)
    tensor("mm.2.weight", n_embd_text, projection_dim)
    tensor("mm.2.bias", n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A random RGB PNG of that size (written by hand: zlib + CRCs, no imaging library)."""
    import struct
    import zlib

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
