"""Read a GGUF file's header without loading weights: validate it and describe it.

A hand-rolled reader because gguf.GGUFReader parses every token string into numpy
objects (seconds for a real vocabulary); this one skims the arrays it does not need.
"""

from __future__ import annotations

import hashlib
import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from runner.core.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# GGUF value type id -> struct format of a scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_LAYER = re.compile(r"blk\.(\d+)\.")
_WANTED_ARRAYS = {"tokenizer.ggml.tokens"}  # arrays we keep only the length (and a digest) of
# arrays (of scalars) kept whole: keys ending so
_VALUED_ARRAYS = (".attention.sliding_window_pattern", ".rope.dimension_sections")
_VALUED_MAX = 512  # ... one value per layer (llama.cpp's limit on layers)


@dataclass(frozen=True)
class GgufInfo:
    path: Path
    file_size: int
    metadata: dict[str, Any]
    n_tensors: int
    n_params: int
    data_end: int  # byte offset where the last tensor's data ends
    # weights per repeating layer (blk.N.*), and of the output head (its norm too; the token
    # embeddings when the head is tied to them): what a GPU offload of N layers places there
    layer_weight_bytes: tuple[int, ...] = ()
    output_weight_bytes: int = 0
    embedding_bytes: int = 0  # the token embeddings (they stay on the CPU)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def arch_int(self, key: str, default: int) -> int:
        """An architecture count; the default when absent or not a non-negative integer."""
        value = self.arch_value(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default

    @property
    def quant_type(self) -> str:
        file_type = self.metadata.get("general.file_type")
        if file_type is None:
            return "unknown"
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            return f"type {file_type}"

    @property
    def n_vocab(self) -> int:
        return _count(self.metadata.get("tokenizer.ggml.tokens"))

    @property
    def vocab_digest(self) -> str:
        """sha256 of the token list as stored: equal digests, the same vocabulary ("" when none)."""
        return str(self.metadata.get("tokenizer.ggml.tokens#sha256", ""))

    @property
    def n_splits(self) -> int:
        """How many files the model is split into (1: not split)."""
        return max(1, _count(self.metadata.get("split.count")))

    @property
    def weights_bytes(self) -> int:
        """Bytes of the whole model: this file, plus the other parts of a split found beside it."""
        if self.n_splits == 1:
            return self.file_size
        return sum(p.stat().st_size for p in self.part_paths if p.exists())

    @property
    def part_paths(self) -> list[Path]:
        """Its files: this one, or a split's parts in order (those of them present or not)."""
        return split_part_paths(self.path, self.n_splits)

    @property
    def n_ctx_train(self) -> int:
        return _count(self.arch_value("context_length"))

    @property
    def has_chat_template(self) -> bool:
        return "tokenizer.chat_template" in self.metadata


def _count(value: Any) -> int:
    """A metadata count, or 0 when the file stores something else there."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ModelFileError(f"{self.path}: truncated GGUF header (the file ends at byte {len(self.buf)})")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def scalars(self, fmt: str, count: int) -> tuple:
        """count scalars of one format, at most _VALUED_MAX of them (one per layer)."""
        if count > _VALUED_MAX:
            raise ModelFileError(f"{self.path}: corrupt GGUF header (an array of {count} values where one "
                                 f"per layer, at most {_VALUED_MAX}, belongs)")
        size = struct.calcsize("<" + fmt) * count
        if self.pos + size > len(self.buf):
            raise ModelFileError(f"{self.path}: truncated GGUF header (the file ends at byte {len(self.buf)})")
        values = struct.unpack_from(f"<{count}{fmt}", self.buf, self.pos)
        self.pos += size
        return values

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise ModelFileError(f"{self.path}: truncated GGUF header (a string runs past the end)")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", "replace")

    def skip_string(self) -> None:
        n = self.take("Q")  # NOTE: not `self.pos += self.take(...)`: that reads pos before take moves it
        self.pos += n

    def value(self, vtype: int, keep: bool, whole: bool = False) -> Any:
        """A value; an array's length if `keep` (else None), or with `whole` its scalars, a tuple."""
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.take("I"), self.take("Q")
            if whole and item_type in _SCALARS:
                return self.scalars(_SCALARS[item_type], count)
            if item_type in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item_type])
            else:
                for _ in range(count):
                    if item_type == _STRING:
                        self.skip_string()
                    else:
                        self.value(item_type, keep=False)
            return count if keep else None
        raise ModelFileError(f"{self.path}: corrupt GGUF (unknown value type {vtype})")


def _type_sizes(ggml_type: int, path: Path) -> tuple[int, int]:
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ModelFileError(f"{path}: corrupt GGUF (unknown tensor type {ggml_type})") from None


def read_gguf(path: Path) -> GgufInfo:
    """Parse and validate a GGUF header; raise ModelFileError with one readable line. A split
    model's first part counts the tensors of every part found beside it (parameters, per-layer
    and head bytes: what `runner info`, Ollama's API and the memory plan read)."""
    path = Path(path)
    head = _read_header(path)
    tensors = _Tensors()
    tensors.add(head)
    n_splits = max(1, _count(head.metadata.get("split.count")))
    if n_splits > 1 and _count(head.metadata.get("split.no")) == 0:
        for part in split_part_paths(path, n_splits)[1:]:
            if part.exists():
                tensors.add(_read_header(part))
    return tensors.info(path, head)


def split_part_paths(path: Path, n_splits: int) -> list[Path]:
    """The files of a split model, in order, named as llama.cpp's gguf-split names them."""
    if n_splits <= 1:
        return [path]
    stem = re.sub(r"-\d{5}-of-\d{5}\.gguf$", "", path.name)
    return [path.with_name(f"{stem}-{i:05d}-of-{n_splits:05d}.gguf") for i in range(1, n_splits + 1)]


@dataclass
class _Header:
    """One file's header: its metadata and what its tensors weigh."""

    path: Path
    file_size: int
    metadata: dict[str, Any]
    n_tensors: int
    n_params: int
    data_end: int
    layers: dict[int, int]  # bytes per repeating layer (blk.N.*)
    named: dict[str, int]  # bytes of every other tensor, by name


@dataclass
class _Tensors:
    """The tensors of a model's files, added up."""

    n_params: int = 0
    layers: dict[int, int] = field(default_factory=dict)
    named: dict[str, int] = field(default_factory=dict)

    def add(self, header: _Header) -> None:
        self.n_params += header.n_params
        for layer, n_bytes in header.layers.items():
            self.layers[layer] = self.layers.get(layer, 0) + n_bytes
        self.named.update(header.named)

    def info(self, path: Path, first: _Header) -> GgufInfo:
        named = self.named
        head = named.get("output.weight", named.get("token_embd.weight", 0))  # tied: the embeddings, duplicated
        head += sum(n for name, n in named.items() if name.startswith("output_norm."))
        per_layer = tuple(self.layers.get(i, 0) for i in range(max(self.layers) + 1)) if self.layers else ()
        return GgufInfo(path, first.file_size, first.metadata, first.n_tensors, self.n_params, first.data_end,
                        per_layer, head, named.get("token_embd.weight", 0))


def _read_header(path: Path) -> _Header:
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a .gguf file")
    file_size = path.stat().st_size
    with path.open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"{path} is not a GGUF model file (it does not start with 'GGUF')")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _parse(_Cursor(buf, path), path, file_size)
            except (ValueError, TypeError, OverflowError, ZeroDivisionError, struct.error) as exc:
                raise ModelFileError(f"{path}: corrupt GGUF metadata ({exc})") from None


def _parse(cur: _Cursor, path: Path, file_size: int) -> _Header:
    cur.pos = 4
    version = cur.take("I")
    if version not in (2, 3):
        raise ModelFileError(f"{path}: unsupported GGUF version {version}")
    n_tensors, n_kv = cur.take("Q"), cur.take("Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.take("I")
        start = cur.pos
        value = cur.value(vtype, keep=key in _WANTED_ARRAYS, whole=key.endswith(_VALUED_ARRAYS))
        if value is not None:
            metadata[key] = value
        if key in _WANTED_ARRAYS:
            metadata[key + "#sha256"] = hashlib.sha256(cur.buf[start:cur.pos]).hexdigest()
    n_params, data_end = 0, 0
    layers: dict[int, int] = {}
    named: dict[str, int] = {}
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("I")
        n_elements = 1
        for _ in range(n_dims):
            n_elements *= cur.take("Q")
        ggml_type, offset = cur.take("I"), cur.take("Q")
        block, type_size = _type_sizes(ggml_type, path)
        n_params += n_elements
        n_bytes = n_elements // block * type_size
        data_end = max(data_end, offset + n_bytes)
        layer = _LAYER.match(name)
        if layer:
            layers[int(layer.group(1))] = layers.get(int(layer.group(1)), 0) + n_bytes
        else:
            named[name] = n_bytes
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0:
        raise ModelFileError(f"{path}: corrupt GGUF metadata (general.alignment is {alignment!r})")
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    total = data_start + data_end
    if total > file_size:
        raise ModelFileError(
            f"{path} is truncated or corrupt: its tensors need {total:,} bytes but the file has {file_size:,}"
        )
    return _Header(path, file_size, metadata, n_tensors, n_params, total, layers, named)
