"""Write a tiny random-weight EAGLE3 draft head (GGUF architecture `eagle3`) for a tiny llama target:
one decoder layer that reads a token with `fc` of the target's three tapped layer inputs. It has no
token embeddings or output head of its own: it borrows the target's, as many published heads do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tiny_gguf import add_shape, add_vocab, tiny_vocab


def write_tiny_eagle3_gguf(path: Path, target_layers: tuple[int, ...] = (0, 1, 2), n_embd_target: int = 64,
                           seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128,
                           scale: float = 0.3, agreeing: bool = False, vocab_of: Path | None = None) -> Path:
    """`agreeing`: `fc` passes the last tapped layer's input through and the layer barely changes it,
    so the head guesses what a target written with `shared` (tiny_gguf) says next. `vocab_of`: a
    target GGUF whose tokenizer the head carries (as a real head does: bench/drafting_cost.py)."""
    rng = np.random.default_rng(seed)
    scale = 0.02 if agreeing else scale
    tokens, types = tiny_vocab()
    head_dim = n_embd // n_head
    arch = "eagle3"
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny-random-eagle3")
    w.add_file_type(0)
    add_shape(w, 1, n_embd, n_ff, n_head, n_head_kv)
    w.add_array(f"{arch}.target_layers", list(target_layers))  # (gguf has no helper for it)
    w.add_uint32(f"{arch}.target_hidden_size", n_embd_target)
    if vocab_of is None:
        w.add_vocab_size(len(tokens))
        add_vocab(w, tokens, types)
    else:
        _copy_vocab(w, vocab_of)

    def tensor(name: str, *shape: int) -> None:  # numpy order: ggml's ne reversed
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    if agreeing:
        w.add_tensor("fc.weight", np.hstack([np.zeros((n_embd, (len(target_layers) - 1) * n_embd_target)),
                                             np.eye(n_embd, n_embd_target)]).astype(np.float32))
    else:
        tensor("fc.weight", n_embd, len(target_layers) * n_embd_target)
    ones("output_norm.weight", n_embd)
    ones("blk.0.attn_norm.weight", n_embd)
    ones("blk.0.attn_norm_2.weight", n_embd)
    tensor("blk.0.attn_q.weight", n_head * head_dim, 2 * n_embd)
    tensor("blk.0.attn_k.weight", n_head_kv * head_dim, 2 * n_embd)
    tensor("blk.0.attn_v.weight", n_head_kv * head_dim, 2 * n_embd)
    tensor("blk.0.attn_output.weight", n_embd, n_head * head_dim)
    ones("blk.0.ffn_norm.weight", n_embd)
    tensor("blk.0.ffn_gate.weight", n_ff, n_embd)
    tensor("blk.0.ffn_up.weight", n_ff, n_embd)
    tensor("blk.0.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _copy_vocab(w: GGUFWriter, target: Path) -> None:
    """The target's tokenizer.ggml.* keys, as stored."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(target))
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.ggml."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            w.add_array(name, list(field.contents()))
        elif kind == GGUFValueType.STRING:
            w.add_string(name, field.contents())
        else:
            w.add_key_value(name, field.contents(), kind)
