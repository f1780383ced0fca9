"""Write a tiny random-weight `glm4moe` GGUF with one MTP (next-token prediction) layer: two dense
trunk blocks and, as blk.2, the MoE block with its nextn tensors, as GLM-4.5's GGUFs carry it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tiny_gguf import add_shape, add_vocab, tiny_vocab


def write_tiny_mtp_gguf(path: Path, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                        n_ff: int = 128, n_ff_exp: int = 32, n_trunk: int = 2, scale: float = 0.3,
                        agreeing: bool = False) -> Path:
    """`agreeing`: weights under which the MTP layer mostly guesses what the target says next (on
    random weights it never does): every token embedding shares one large direction, the blocks
    barely change the residual stream, and the MTP layer's eh_proj averages its two inputs, so the
    target's and the MTP's logits are both nearly the output head applied to that direction."""
    rng = np.random.default_rng(seed)
    tokens, types = tiny_vocab()
    n_vocab, head_dim, n_expert = len(tokens), n_embd // n_head, 2
    path.parent.mkdir(parents=True, exist_ok=True)
    arch = "glm4moe"
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny-random-glm4moe-mtp")
    w.add_file_type(0)
    add_shape(w, n_trunk + 1, n_embd, n_ff, n_head, n_head_kv)
    w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    w.add_uint32(f"{arch}.leading_dense_block_count", n_trunk)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(1)
    w.add_expert_shared_count(1)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_uint32(f"{arch}.expert_gating_func", 2)  # sigmoid, as GLM-4.5
    w.add_vocab_size(n_vocab)
    add_vocab(w, tokens, types)

    block_scale = 0.02 if agreeing else scale

    def tensor(name: str, *shape: int, scale: float = block_scale) -> None:  # numpy order: ggml's ne reversed
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    if agreeing:  # (as tiny_gguf's shared_direction_embeddings, the direction drawn first)
        shared = rng.standard_normal(n_embd)
        w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, n_embd)) * 0.7 + shared).astype(np.float32))
    else:
        tensor("token_embd.weight", n_vocab, n_embd, scale=1.0)
    ones("output_norm.weight", n_embd)
    tensor("output.weight", n_vocab, n_embd, scale=1.0)
    for i in range(n_trunk + 1):
        ones(f"blk.{i}.attn_norm.weight", n_embd)
        tensor(f"blk.{i}.attn_q.weight", n_head * head_dim, n_embd)
        tensor(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd)
        tensor(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd)
        tensor(f"blk.{i}.attn_output.weight", n_embd, n_head * head_dim)
        ones(f"blk.{i}.post_attention_norm.weight", n_embd)
        if i < n_trunk:  # the dense trunk
            tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
            tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
            tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
            continue
        tensor(f"blk.{i}.ffn_gate_inp.weight", n_expert, n_embd)
        w.add_tensor(f"blk.{i}.exp_probs_b.bias", np.zeros(n_expert, dtype=np.float32))
        tensor(f"blk.{i}.ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd)
        tensor(f"blk.{i}.ffn_up_exps.weight", n_expert, n_ff_exp, n_embd)
        tensor(f"blk.{i}.ffn_down_exps.weight", n_expert, n_embd, n_ff_exp)
        tensor(f"blk.{i}.ffn_gate_shexp.weight", n_ff_exp, n_embd)
        tensor(f"blk.{i}.ffn_up_shexp.weight", n_ff_exp, n_embd)
        tensor(f"blk.{i}.ffn_down_shexp.weight", n_embd, n_ff_exp)
        if agreeing:
            w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", np.hstack([np.eye(n_embd)] * 2).astype(np.float32) / 2)
        else:
            tensor(f"blk.{i}.nextn.eh_proj.weight", n_embd, 2 * n_embd)
        ones(f"blk.{i}.nextn.enorm.weight", n_embd)
        ones(f"blk.{i}.nextn.hnorm.weight", n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
