"""What a router serves: every model a request may name, with its own engine options, found from
the MODEL arguments, the cache and the catalog, `--models-dir` and `--models-config`."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.catalog.catalog import Catalog
from runner.catalog.hub import parse_hub_ref
from runner.catalog.store import ModelStore
from runner.config.options import EngineOptions
from runner.core.errors import OptionError
from runner.config.keep_alive import parse_keep_alive
from runner.runtime.gguf_file import read_gguf

_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})$")
_ROUTER_KEYS = {"model", "aliases", "pin", "keep_alive"}  # besides EngineOptions' fields


@dataclass(frozen=True)
class ServableModel:
    name: str  # what a request's `model` names
    source: str  # what the model process loads: a catalog name, a Hub reference or a .gguf path
    options: EngineOptions
    aliases: tuple[str, ...] = ()
    is_pinned: bool = False  # never evicted
    keep_alive_s: float | None = None  # None: the server's --keep-alive

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def name_of(model: str, catalog: Catalog) -> str:
    """The served name of a MODEL argument: a catalog name or Hub reference as typed, a file's stem."""
    if catalog.is_name(model) or parse_hub_ref(model):
        return model
    return Path(model).stem


def ggufs_in(directory: Path) -> list[Path]:
    """The models under a directory: every .gguf but projectors, EAGLE3 heads and the later parts of split files."""
    if not directory.is_dir():
        raise OptionError(f"--models-dir: not a directory: {directory}")
    found = []
    for path in sorted(directory.rglob("*.gguf")):
        split = _SPLIT_PART.search(path.stem)
        if path.name.lower().startswith(("mmproj", "eagle3")) or (split and split.group(1) != "00001"):
            continue
        found.append(path)
    return found


def servable_models(named: list[str], options: EngineOptions, store: ModelStore, models_dir: Path | None = None,
                    config: dict[str, dict[str, Any]] | None = None) -> list[ServableModel]:
    """The named models, else every cached and catalog model; then --models-dir's files and the
    config's own sections. The first is the default model (a request that names none gets it)."""
    sources: dict[str, str] = {}
    if named:
        for model in named:
            _check_named(model, store.catalog)
            sources.setdefault(name_of(model, store.catalog), model)
    else:
        if store.catalog.default:
            sources[store.catalog.default] = store.catalog.default
        for cached in store.cached():
            if store.catalog.is_name(cached.name) or parse_hub_ref(cached.name):
                sources.setdefault(cached.name, cached.name)
            else:
                sources.setdefault(cached.path.stem, str(cached.path))
        for name in store.catalog.names():
            sources.setdefault(name, name)
    for path in ggufs_in(models_dir) if models_dir is not None else []:
        sources.setdefault(_SPLIT_PART.sub("", path.stem), str(path))
    config = config or {}
    for name, section in config.items():
        if "model" in section:
            sources[name] = str(section["model"])
        elif name not in sources:
            raise OptionError(f"--models-config: [models.\"{name}\"] is not a servable model and names no 'model' "
                              "to load")
    models = [_servable(name, source, options, config.get(name, {})) for name, source in sources.items()]
    _check_unique_ids(models)
    return models


def _check_named(model: str, catalog: Catalog) -> None:
    """A MODEL argument that cannot be served is refused at start, as `runner serve MODEL` refuses it:
    an unknown catalog name (with the close ones), a missing file, a file that is not a GGUF. (A
    catalog model or Hub reference not cached yet is pulled on first use.)"""
    if parse_hub_ref(model):
        return
    path = Path(model).expanduser()
    if catalog.is_name(model) or not (path.suffix == ".gguf" or os.sep in model or path.exists()):
        catalog.resolve(model)
    else:
        read_gguf(path)


def _servable(name: str, source: str, options: EngineOptions, section: dict[str, Any]) -> ServableModel:
    fields = {f.name for f in dataclasses.fields(EngineOptions)}
    unknown = sorted(set(section) - fields - _ROUTER_KEYS)
    if unknown:
        raise OptionError(f"--models-config: [models.\"{name}\"] has unknown keys: {', '.join(unknown)} (known: "
                          f"{', '.join(sorted(fields | _ROUTER_KEYS))})")
    overrides = {k: v for k, v in section.items() if k in fields}
    for key, value in overrides.items():
        expected = type(getattr(options, key))
        if key == "n_gpu_layers" and type(value) is int:  # a count, or the string "auto"
            overrides[key] = value = str(value)
        if type(value) is not expected:
            raise OptionError(f"--models-config: [models.\"{name}\"] {key} must be a{'n' if expected is int else ''} "
                              f"{expected.__name__}, got {value!r}")
    aliases = section.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise OptionError(f"--models-config: [models.\"{name}\"] aliases must be a list of names")
    keep_alive = section.get("keep_alive")
    try:
        options = dataclasses.replace(options, **overrides)  # (checks each value: a choice, a range)
    except OptionError as exc:
        raise OptionError(f"--models-config: [models.\"{name}\"] {exc}") from None
    return ServableModel(name, source, options, tuple(aliases),
                         bool(section.get("pin", False)),
                         None if keep_alive is None else parse_keep_alive(keep_alive, "keep_alive"))


def _check_unique_ids(models: list[ServableModel]) -> None:
    seen: dict[str, str] = {}
    for model in models:
        for model_id in model.ids:
            if model_id in seen and seen[model_id] != model.name:
                raise OptionError(f"the model id '{model_id}' would name both '{seen[model_id]}' and '{model.name}'")
            seen[model_id] = model.name


def read_models_config(path: Path) -> dict[str, dict[str, Any]]:
    """--models-config FILE: `[models."NAME"]` sections of per-model settings."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise OptionError(f"cannot read --models-config: {exc.strerror}: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionError(f"--models-config {path}: not TOML: {exc}") from None
    models = data.get("models", {})
    if set(data) - {"models"} or not isinstance(models, dict) or not all(isinstance(s, dict) for s in models.values()):
        raise OptionError(f"--models-config {path}: expected only [models.\"NAME\"] sections")
    return models
