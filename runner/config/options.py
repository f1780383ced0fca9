"""Engine options, each declared once: the dataclass field drives the CLI flag and the default."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from runner.core.errors import OptionError
from runner.core.ranges import is_within, span
from runner.sampling.params import SamplingParams

T = TypeVar("T")
# KV cache types: bytes per stored value (ggml block sizes); llama.py maps each name to its ggml type
KV_BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
DEFAULT_MAX_TOKENS = 1024  # a reply's length when nobody says (also never past the slot's context)
N_UBATCH_MAX = 512  # llama.cpp runs a batch in micro-batches of at most this many tokens (its n_ubatch)
INVARIANT_UBATCH = 63  # ... and under --batch-invariant on, of fewer than flash attention's 64 (micro_batch_max)


def physical_cores(cpuinfo: str | None = None) -> int:
    """Cores, not hardware threads: llama.cpp's decode gains nothing from a core's second thread.
    From /proc/cpuinfo's (physical id, core id) pairs where there are any, else os.cpu_count()."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return os.cpu_count() or 1
    cores, package = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            package = value.strip()
        elif key.strip() == "core id":
            cores.add((package, value.strip()))
    return len(cores) or os.cpu_count() or 1


def _opt(default: Any, help: str, flag: str | None = None, choices: tuple[str, ...] | None = None,
         lo: float | None = None, hi: float | None = None) -> Any:
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices, "range": (lo, hi)})


def in_range(kind: type, lo: float | None = None, hi: float | None = None) -> Callable[[str], Any]:
    """An argparse type: the text as `kind` (int or float), refused unless finite and within [lo, hi]."""
    def parse(text: str) -> Any:
        value = kind(text)  # (ValueError: argparse says "invalid int value")
        if not is_within(value, lo, hi):
            raise argparse.ArgumentTypeError(f"must be {span(lo, hi)}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


PORT = in_range(int, 0, 65535)
MIN_CTX_SIZE = 32  # a slot's context: a few turns' worth of tokens at the least


@dataclass(frozen=True)
class EngineOptions:
    parallel: int = _opt(4, "KV slots = requests decoded at once (one llama.cpp sequence each)", lo=1)
    ctx_size: int = _opt(4096, "context tokens per slot (total KV = parallel x ctx-size)", lo=MIN_CTX_SIZE)
    batch_size: int = _opt(512, "tokens per engine step (decode rows + prompt chunks); at least --parallel",
                           lo=2)
    threads: int = _opt(physical_cores(), "CPU threads for llama.cpp", lo=1)
    n_gpu_layers: str = _opt("auto", "layers on the GPU of a CUDA/Metal build: auto (as many as its free memory holds, "
                                     "leaving 1 GiB), a number, or -1 (all); none without a GPU",
                             flag="--n-gpu-layers")
    rpc: str = _opt("", "RPC workers (`runner rpc-worker` on other machines) to place the model's layers on: "
                        "HOST:PORT[,HOST:PORT...]; a server then runs the model in a process of its own, so a worker "
                        "that dies takes only that model down")
    tensor_split: str = _opt("", "with --rpc: the share of layers for this machine, then each worker in order, "
                                 "e.g. 1,2,2 (default: every layer on the workers, by their free memory)")
    max_tokens: int = _opt(DEFAULT_MAX_TOKENS, "most tokens in a reply when a request does not say (and never past the slot's "
                                 "context)", lo=1)
    max_queue: int = _opt(64, "generations (choices, beams, prompts) that may wait for a slot before the server "
                             "answers 503", lo=0)
    kv_type: str = _opt("f16", "KV cache type: f16, q8_0 (half the memory) or q4_0 (a quarter)", choices=tuple(KV_BYTES_PER_VALUE))
    draft: str = _opt("", "speculative decoding drafter: a draft model (catalog name or .gguf) or 'ngram'")
    draft_max: int = _opt(4, "most tokens drafted per slot and step", lo=1)
    ngram_store_mb: int = _opt(16, "with --draft ngram: MiB for n-grams learned from every request's replies, "
                                   "shared by all slots (drafts where a request's own context has none; 0: off)", lo=0)
    mmproj: str = _opt("", "a vision (or audio) projector for the model: an mmproj .gguf, a Hub reference or a "
                           "catalog name; a catalog model names its own")
    media_cache_mb: int = _opt(256, "MiB of encoded images kept by content: an image sent again is decoded from "
                                    "them instead of encoded again (0: off)", lo=0)
    spec: str = _opt("", "speculation: auto (decide per slot and step), on (always draft), off; mtp (always "
                         "draft with the model's own MTP layers), eagle3 (always draft with the EAGLE3 head given "
                         "as --draft); default auto when a drafter is set or the model has MTP layers",
                     choices=("", "auto", "on", "off", "mtp", "eagle3"))
    jump_forward: str = _opt("on", "constrained replies (response_format, grammar): where the grammar allows one "
                                   "continuation, decode those tokens in one step", choices=("on", "off"))
    flash_attn: str = _opt("auto", "llama.cpp's flash attention: auto (llama.cpp decides; on for CPUs), on, off "
                                   "(a quantized --kv-type needs it)", choices=("auto", "on", "off"))
    batch_invariant: str = _opt("off", "on: where llama.cpp's kernels would make a token's logits depend on what "
                                       "shares its step (F16/F32 weights on x86, found by a probe at load), pad "
                                       "lone rows and keep micro-batches under 64 tokens, so greedy output is the "
                                       "same cold or cached, alone, under load and with speculation (costs: "
                                       "docs/benchmarks.md); off: never pad, micro-batches of up to 512",
                                       choices=("off", "on"))
    swa_full: str = _opt("off", "sliding-window layers (gemma 2/3's): off keeps only their window of KV, as "
                                "llama-server does (a prefix cached past it is read again, or from the last "
                                "prompt's end); on keeps it as long as the context (any cached prefix "
                                "serves; several times the KV memory)", choices=("off", "on"))


    def __post_init__(self) -> None:  # (the flags check these first; this is for the Python API)
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices is not None and getattr(self, f.name) not in choices:
                named = ", ".join(repr(c) for c in choices)
                raise OptionError(f"{_flag(f)} must be one of {named}; got {getattr(self, f.name)!r}")
            lo, hi = f.metadata.get("range", (None, None))
            if isinstance(getattr(self, f.name), (int, float)) and not is_within(getattr(self, f.name), lo, hi):
                raise OptionError(f"{_flag(f)} must be {span(lo, hi)}, got {getattr(self, f.name)}")
        if self.batch_size < self.parallel:  # (llama.cpp would abort on a step with every slot's next token)
            raise OptionError(f"--batch-size must be at least --parallel ({self.parallel}): every slot's next "
                              f"token goes into one step; got {self.batch_size}")


def flash_attention(options: EngineOptions) -> str:
    """What llama.cpp's flash attention is set to (on, off or auto) for these options: a quantized
    V cache needs it on."""
    if options.kv_type != "f16":
        if options.flash_attn == "off":
            raise OptionError(f"--kv-type {options.kv_type} needs flash attention: leave out --flash-attn off")
        return "on"
    return options.flash_attn


def micro_batch_max(options: EngineOptions) -> int:
    """Tokens per llama.cpp micro-batch (its n_ubatch). Flash attention's CPU kernel takes another
    path for 64 or more rows than for fewer, so a prompt's last token computed inside a long
    prefill chunk (cold) gets other logits than the same token computed alone after its cached
    prefix: batch-invariant mode keeps every micro-batch under 64 tokens (and pads lone rows,
    runtime.model_runner), so every row takes the few-rows path."""
    return INVARIANT_UBATCH if options.batch_invariant == "on" else N_UBATCH_MAX


SAMPLING_HELP = {
    "temperature": "sampling temperature (0: greedy)",
    "top_k": "keep the k most likely tokens (0: off)",
    "top_p": "nucleus sampling threshold (1: off)",
    "min_p": "drop tokens below min-p x the top probability (0: off)",
    "repeat_penalty": "penalty for tokens among the last repeat-last-n (1: off)",
    "repeat_last_n": "how many recent tokens the repeat penalty looks at",
    "presence_penalty": "OpenAI presence penalty",
    "frequency_penalty": "OpenAI frequency penalty",
    "seed": "random seed (same seed, same output)",
}


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, cls: type, overrides: dict[str, Any] | None = None) -> None:
    """One flag per dataclass field; `overrides` changes a default for this command only."""
    overrides = overrides or {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli") is False:
            continue
        default = overrides.get(f.name, f.default)
        kind = type(f.default) if f.default is not None else int
        help_text = f.metadata.get("help") or SAMPLING_HELP.get(f.name, "")
        checked = in_range(kind, *f.metadata["range"]) if kind in (int, float) and "range" in f.metadata else kind
        parser.add_argument(_flag(f), dest=f.name, type=checked, default=default, choices=f.metadata.get("choices"),
                            help=f"{help_text} (default: {default})")


def to_flags(values: object, unless_as: object | None = None) -> list[str]:
    """The command-line flags that give these values (add_flags' inverse), e.g. for a child process;
    with `unless_as`, only those of values that differ from its."""
    out: list[str] = []
    for f in dataclasses.fields(values):  # type: ignore[arg-type]
        value = getattr(values, f.name)
        if f.metadata.get("cli") is not False and (unless_as is None or value != getattr(unless_as, f.name)):
            out += [_flag(f), str(value)]
    return out


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                  if f.metadata.get("cli") is not False})


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return from_args(SamplingParams, args)
