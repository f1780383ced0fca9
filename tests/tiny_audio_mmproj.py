"""Write a tiny random-weight audio projector (an mmproj with a whisper-style encoder) for the tiny
llama of tiny_gguf: projector type ultravox (its stacking makes 50 embeddings of a 30-second mel
window, so a short clip is a short span), 80 mel bins, an encoder 32 wide with one block.

The encoder's position table must hold 1,500 rows whatever the clip's length: libmtmd pads every
clip to 30 seconds and builds its graph for that shape at load."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

N_POSITIONS = 1500  # 3,000 mel frames of 30 s, halved by the second convolution


def write_tiny_audio_mmproj(path: Path, n_embd_text: int = 64, seed: int = 0, n_mel: int = 80, n_embd: int = 32,
                            n_ff: int = 64, n_head: int = 2, stack: int = 30, n_mid: int = 32) -> Path:
    rng = np.random.default_rng(seed)

    def random(*shape: int, scale: float = 0.05) -> np.ndarray:  # numpy order: ggml's ne reversed
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "clip")
    w.add_clip_has_audio_encoder(True)
    w.add_clip_projector_type("ultravox")
    w.add_audio_num_mel_bins(n_mel)
    w.add_audio_embedding_length(n_embd)
    w.add_audio_feed_forward_length(n_ff)
    w.add_audio_block_count(1)
    w.add_audio_head_count(n_head)
    w.add_audio_projection_dim(n_embd_text)
    w.add_audio_attention_layernorm_eps(1e-5)
    w.add_uint32("clip.audio.projector.stack_factor", stack)
    w.add_tensor("a.conv1d.1.weight", random(n_embd, n_mel, 3).astype(np.float16))
    w.add_tensor("a.conv1d.1.bias", random(n_embd, 1))  # (2-D: added to every frame)
    w.add_tensor("a.conv1d.2.weight", random(n_embd, n_embd, 3).astype(np.float16))
    w.add_tensor("a.conv1d.2.bias", random(n_embd, 1))
    w.add_tensor("a.position_embd.weight", random(N_POSITIONS, n_embd))
    block = "a.blk.0"
    for norm in ("ln1", "ln2"):
        w.add_tensor(f"{block}.{norm}.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"{block}.{norm}.bias", np.zeros(n_embd, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        w.add_tensor(f"{block}.{name}.weight", random(n_embd, n_embd))
        if name != "attn_k":  # (whisper's key projection has no bias: libmtmd asserts there is none)
            w.add_tensor(f"{block}.{name}.bias", random(n_embd))
    w.add_tensor(f"{block}.ffn_up.weight", random(n_ff, n_embd))
    w.add_tensor(f"{block}.ffn_down.weight", random(n_embd, n_ff))
    w.add_tensor("mm.a.norm_pre.weight", np.ones(n_embd * stack, np.float32))
    w.add_tensor("mm.a.mlp.1.weight", random(2 * n_mid, n_embd * stack))
    w.add_tensor("mm.a.norm_mid.weight", np.ones(n_mid, np.float32))
    w.add_tensor("mm.a.mlp.2.weight", random(n_embd_text, n_mid, scale=0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def wav_bytes(seconds: float = 1.0, hz: float = 440.0, rate: int = 16000) -> bytes:
    """A mono 16-bit WAV of a sine tone."""
    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * hz * t) * 12000).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples.tobytes())
    return out.getvalue()
