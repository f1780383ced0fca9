"""How Ollama's API describes a model (/api/tags, /api/show, /api/ps), read from its GGUF header:
the same for a model's own server and for a router that lists models it has not loaded."""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from runner.runtime.gguf_file import GgufInfo

OLLAMA_VERSION = "0.12.0"  # the API version answered at /api/version (the shapes this translation follows)
_SCALAR = (str, int, float, bool)


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).astimezone().isoformat()


def digest(info: GgufInfo) -> str:
    """A stable id of the file (Ollama's is its blob's sha256; hashing gigabytes per listing is not
    worth it: this is the sha256 of its name, size and modification time)."""
    stat = info.path.stat()
    return hashlib.sha256(f"{info.path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()


def parameter_size(n_params: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n_params >= size:
            return f"{n_params / size:.1f}{unit}".replace(".0" + unit, unit)
    return str(n_params)


def details(info: GgufInfo) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
            "parameter_size": parameter_size(info.n_params), "quantization_level": info.quant_type}


def capabilities(info: GgufInfo) -> list[str]:
    """completion (embedding instead for an embedding model: its GGUF names a pooling); tools where
    the template renders them; insert where the vocabulary has fill-in-the-middle tokens; thinking
    where the template opens a think block."""
    if info.arch_value("pooling_type") is not None:  # an embedding model: what it does is embed
        return ["embedding"]
    template = str(info.metadata.get("tokenizer.chat_template", ""))
    found = ["completion"]
    if "tools" in template:
        found.append("tools")
    if "tokenizer.ggml.fim_pre_token_id" in info.metadata:
        found.append("insert")
    if "<think>" in template:
        found.append("thinking")
    return found


def tag(name: str, info: GgufInfo) -> dict[str, Any]:
    """/api/tags' entry."""
    return {"name": name, "model": name, "modified_at": _iso(info.path.stat().st_mtime),
            "size": info.weights_bytes, "digest": digest(info), "details": details(info)}


def running(name: str, info: GgufInfo, memory_bytes: int, expires_at: float | None, context_length: int,
            vram_bytes: int = 0) -> dict[str, Any]:
    """/api/ps' entry (expires_at None: kept loaded for as long as the server runs; context_length:
    a slot's, what a request may use, as Ollama reports the context it runs with)."""
    until = expires_at if expires_at is not None else datetime.datetime(9999, 12, 31).timestamp()
    return {**tag(name, info), "expires_at": _iso(until), "size_vram": vram_bytes, "size": memory_bytes,
            "context_length": context_length}


def show(info: GgufInfo) -> dict[str, Any]:
    """/api/show's answer: the template, details, the GGUF's scalar keys as model_info, capabilities."""
    model_info = {k: v for k, v in info.metadata.items()
                  if isinstance(v, _SCALAR) and not k.startswith("tokenizer.chat_template") and "#" not in k}
    model_info["general.parameter_count"] = info.n_params
    return {"modelfile": "", "parameters": "", "license": str(info.metadata.get("general.license", "")),
            "template": str(info.metadata.get("tokenizer.chat_template", "")), "details": details(info),
            "model_info": model_info, "capabilities": capabilities(info),
            "modified_at": _iso(info.path.stat().st_mtime)}
