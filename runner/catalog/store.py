"""The local model cache: where files live, what is there, and turning a MODEL argument into a path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from runner.catalog import hub
from runner.catalog.catalog import Catalog, ModelRef
from runner.catalog.embedded import embedded_model
from runner.core.errors import CatalogError, ModelFileError

CACHE_ENV = "RUNNER_CACHE_DIR"


def cache_dir() -> Path:
    """$RUNNER_CACHE_DIR, else the platform's user cache dir (e.g. ~/.cache/runner/models)."""
    override = os.environ.get(CACHE_ENV)
    path = Path(override) if override else Path(platformdirs.user_cache_dir("runner")) / "models"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CatalogError(f"cannot create the model cache {path}: {exc.strerror}; set {CACHE_ENV} to a "
                           "writable directory") from None
    return path


@dataclass(frozen=True)
class CachedModel:
    name: str  # catalog name, or the file name when the catalog does not know it
    path: Path
    size_bytes: int


class ModelStore:
    def __init__(self, catalog: Catalog | None = None, root: Path | None = None, quiet: bool = False) -> None:
        """`quiet`: what resolve pulls shows no progress (`runner run -q`)."""
        self.catalog = catalog or Catalog.load()
        self._root = root
        self.quiet = quiet

    @property
    def root(self) -> Path:
        """The cache directory, made when first needed (a local .gguf file loads without one)."""
        if self._root is None:
            self._root = cache_dir()
        return self._root

    def writable_root(self) -> Path | None:
        """The cache directory, or None where it cannot be made (what is measured is then not kept)."""
        try:
            return self.root
        except CatalogError:
            return None

    def path_of(self, ref: ModelRef) -> Path:
        return self.root / ref.file

    def cached(self) -> list[CachedModel]:
        """Every model in the cache, once, by the name that loads and removes it (a catalog model's
        own name, the Hub's hf.co/ORG/REPO/FILE, else the file's name)."""
        by_file = {self.catalog.resolve(n).file: n for n in self.catalog.names()}
        hub_cache = hub.HubCache(self.root)
        by_hub_path = {}
        for name in self.catalog.names():
            hub_ref = self.hub_ref(name) if self.catalog.resolve(name).entry.hub else None
            parts = hub_cache.cached_parts(hub_ref) if hub_ref is not None else None
            if parts:
                by_hub_path[parts[0]] = name
        out = []
        for path in sorted(self.root.glob("*.gguf")):
            out.append(CachedModel(by_file.get(path.name, path.name), path, path.stat().st_size))
        for name, parts in hub_cache.files():
            out.append(CachedModel(by_hub_path.get(parts[0], name), parts[0], sum(p.stat().st_size for p in parts)))
        return out

    def hub_ref(self, model: str) -> hub.HubRef | None:
        """The Hub reference MODEL is, or that its catalog entry names (None: neither)."""
        ref = hub.parse_hub_ref(model)
        if ref is None and self.catalog.is_name(model) and self.catalog.resolve(model).entry.hub:
            ref = hub.parse_hub_ref(self.catalog.resolve(model).entry.hub)
        return ref

    def projector_of(self, model: str) -> Path | None:
        """The cached projector a Hub model's repo provides (pulled with it); None for other models."""
        hub_ref = self.hub_ref(model)
        return hub.HubCache(self.root).projector(hub_ref) if hub_ref is not None else None

    def eagle3_head_of(self, model: str) -> Path | None:
        """The cached EAGLE3 head a Hub model's repo publishes beside it (pulled with it); None for other models."""
        hub_ref = self.hub_ref(model)
        return hub.HubCache(self.root).eagle3_head(hub_ref) if hub_ref is not None else None

    def remove(self, name: str) -> list[Path]:
        paths = self.files_of(name)
        for path in paths:
            try:
                path.unlink()
            except OSError as exc:
                raise CatalogError(f"cannot remove {path}: {exc.strerror or exc}") from None
        hub_ref = self.hub_ref(name)
        if hub_ref is not None:
            hub.HubCache(self.root).forget_empty(hub_ref.repo)
        return paths

    def files_of(self, name: str) -> list[Path]:
        """The cached files `remove(name)` deletes: the model's (every part of a split) and, with a
        Hub repo's last model, its projector and EAGLE3 head (CatalogError: not cached)."""
        hub_ref = self.hub_ref(name)
        if hub_ref is not None:
            cache = hub.HubCache(self.root)
            paths = cache.cached_parts(hub_ref)
            if not paths:
                left = cache.interrupted_download(hub_ref)  # (PullError: a pull is writing it)
                if not left:
                    raise CatalogError(f"'{name}' is not in the cache ({self.root})")
                return left
        elif not self.catalog.is_name(name) and Path(name).name == name and (self.root / name).is_file():
            paths = [self.root / name]  # a file in the cache the catalog does not know (as `runner list` names it)
        else:
            ref = self.catalog.resolve(name)
            paths = [self.path_of(ref)]
            if not paths[0].exists():
                raise CatalogError(f"'{ref.name}' is not in the cache ({self.root})")
        if hub_ref is not None:  # a vision model's projector, its EAGLE3 head: they go with the repo's last model
            companions = [p for p in (self.projector_of(name), self.eagle3_head_of(name)) if p is not None]
            others = [f for f in paths[0].parent.glob("*.gguf") if f not in paths and not hub.is_companion(f.name)]
            paths += companions if not others else []
        return paths

    def resolve(self, model: str, pull_missing: bool = True) -> tuple[Path, ModelRef | None]:
        """MODEL is a path to a .gguf, a Hub reference or a catalog name; a missing model is pulled
        (a cached Hub reference loads without a network call), with progress on stderr unless quiet."""
        if not model.strip():
            raise CatalogError("the model is empty: name a .gguf file, a catalog model or hf.co/ORG/REPO")
        hub_ref = self.hub_ref(model)
        if hub_ref is not None:
            ref = None if hub.parse_hub_ref(model) else self.catalog.resolve(model)
            cached = hub.HubCache(self.root).cached(hub_ref)
            if cached is None and not pull_missing:
                raise CatalogError(f"'{model}' is not in the cache; run `runner pull {model}`")
            return cached or hub.resolve(hub_ref, self.root, quiet=self.quiet), ref
        candidate = Path(model).expanduser()
        looks_like_path = candidate.suffix == ".gguf" or os.sep in model or candidate.exists()
        if looks_like_path and not self.catalog.is_name(model):
            if not candidate.exists() and candidate.name == model and (self.root / model).is_file():
                return self.root / model, None  # a file in the cache the catalog does not know
            if not candidate.exists():
                raise ModelFileError(f"model file not found: {model}")
            return candidate, None
        ref = self.catalog.resolve(model)
        path = self.path_of(ref)
        embedded = embedded_model()
        if not path.exists() and embedded is not None and embedded.name == ref.file:
            return embedded, ref  # the executable carries this one
        if not path.exists():
            if not pull_missing:
                raise CatalogError(f"'{ref.name}' is not in the cache; run `runner pull {ref.name}`")
            from runner.catalog.pull import pull

            pull(ref, self, quiet=self.quiet)
        return path, ref


def shares_a_file(paths: list[Path], others: list[Path]) -> bool:
    """Whether any of `paths` is one of `others`, however each is spelled (relative, through a
    symbolic link). A hard link is a file of its own: removing it leaves the other."""
    return bool({p.resolve() for p in paths} & {p.resolve() for p in others})
