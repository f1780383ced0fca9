"""Write a tiny random-weight llama GGUF (byte-level BPE vocab, 2 layers) for fast engine tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def add_vocab(w: GGUFWriter, tokens: list[str], types: list[TokenType], chat_template: bool | str = True) -> None:
    """The byte-level BPE tokenizer (and ChatML, or the given template) of every tiny model."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(CHATML if chat_template is True else chat_template)


def add_shape(w: GGUFWriter, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
              eps: float = 1e-5) -> None:
    """The transformer's sizes every tiny model states the same way (2,048 positions of context)."""
    w.add_block_count(n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(eps)


def shared_direction_embeddings(rng: np.random.Generator, n_vocab: int, n_embd: int, length: float) -> np.ndarray:
    """Token embeddings that share one direction of this length (with small blocks, a model whose
    logits barely depend on the input: one its draft heads can be made to guess)."""
    return (rng.standard_normal((n_vocab, n_embd)) * 0.7 + length * rng.standard_normal(n_embd)).astype(np.float32)


def tiny_vocab() -> tuple[list[str], list[TokenType]]:
    """The tokens of a tiny model with no extras: specials, the 256 byte stand-ins, the merges."""
    tokens = SPECIALS + byte_level_alphabet() + ["".join(m) for m in MERGES]
    return tokens, [TokenType.CONTROL] * len(SPECIALS) + [TokenType.NORMAL] * (len(tokens) - len(SPECIALS))


def write_tiny_gguf(path: Path, seed: int = 0, n_embd: int = 64, n_layer: int = 2, chat_template: bool | str = True,
                    extra_tokens: tuple[str, ...] = (), perturb: float = 0.0, split_max_tensors: int = 0,
                    pooling_type: int | None = None, extra_specials: tuple[str, ...] = (), n_head: int = 4,
                    n_head_kv: int = 2, n_ff: int = 128, n_vocab: int = 0, scale: float = 0.3,
                    shared: float = 0.0) -> Path:
    """`perturb` > 0 adds noise of that scale to every weight: a near-twin of the seed's model.
    chat_template: True for ChatML, or a template's source. split_max_tensors > 0 writes a split
    GGUF (STEM-00001-of-0000N.gguf, ... beside `path`). pooling_type: an embedding model's pooling
    (llama.cpp's enum: 1 mean, 2 CLS, 3 last). extra_specials: tags such as <think> that tokenize whole
    (user-defined tokens: parsed from text, rendered as their text). n_head, n_head_kv, n_ff, and n_vocab
    (padded with made-up tokens; 0: just the byte-level set) give a real model's shapes; `scale` is the
    weights' standard deviation; `shared` > 0 gives every token embedding one common direction of that
    length (with a small `scale`, the residual stream and so the logits barely depend on the input: a
    model whose draft heads can be made to guess it)."""
    rng = np.random.default_rng(seed)
    noise = np.random.default_rng(seed + 1000)
    tokens = SPECIALS + byte_level_alphabet() + ["".join(m) for m in MERGES] + list(extra_tokens) + list(extra_specials)
    types = ([TokenType.CONTROL] * len(SPECIALS) + [TokenType.NORMAL] * (len(tokens) - len(SPECIALS) - len(extra_specials))
             + [TokenType.USER_DEFINED] * len(extra_specials))
    padding = [f"<pad{i}>" for i in range(max(0, n_vocab - len(tokens)))]
    tokens += padding
    types += [TokenType.NORMAL] * len(padding)
    n_vocab = len(tokens)
    head_dim = n_embd // n_head

    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_name("tiny-random-llama")
    w.add_file_type(0)  # all F32
    add_shape(w, n_layer, n_embd, n_ff, n_head, n_head_kv)
    w.add_vocab_size(n_vocab)
    if pooling_type is not None:
        w.add_uint32("llama.pooling_type", pooling_type)
    add_vocab(w, tokens, types, chat_template)

    def tensor(name: str, *shape: int, scale: float = scale) -> None:
        weights = rng.standard_normal(shape) * scale
        if perturb:
            weights += noise.standard_normal(shape) * scale * perturb
        w.add_tensor(name, weights.astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    if shared:
        w.add_tensor("token_embd.weight", shared_direction_embeddings(rng, n_vocab, n_embd, shared))
    else:
        tensor("token_embd.weight", n_vocab, n_embd, scale=1.0)
    ones("output_norm.weight", n_embd)
    tensor("output.weight", n_vocab, n_embd, scale=1.0)
    for i in range(n_layer):
        ones(f"blk.{i}.attn_norm.weight", n_embd)
        tensor(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        tensor(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd)
        tensor(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd)
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
