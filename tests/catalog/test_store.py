"""The model cache: MODEL arguments resolved to files, listing and removal (nothing is pulled here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.catalog.catalog import Catalog
from runner.catalog.store import ModelStore
from runner.core.errors import CatalogError, ModelFileError


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(Catalog.load(), root=tmp_path)


def test_a_path_resolves_to_itself_without_a_catalog_entry(store: ModelStore, tiny_gguf: Path) -> None:
    assert store.resolve(str(tiny_gguf)) == (tiny_gguf, None)


def test_a_missing_file_is_one_line(store: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="model file not found: .*nope.gguf"):
        store.resolve(str(tmp_path / "nope.gguf"))


def test_a_cached_catalog_name_resolves_into_the_cache(store: ModelStore) -> None:
    ref = store.catalog.resolve("smollm2-135m-instruct")
    (store.root / ref.file).write_bytes(b"GGUF")
    path, got = store.resolve("smollm2-135m-instruct", pull_missing=False)
    assert path == store.root / ref.file and got == ref
    assert [(c.name, c.size_bytes) for c in store.cached()] == [("smollm2-135m-instruct", 4)]


def test_an_uncached_name_without_pulling_says_how_to_pull(store: ModelStore) -> None:
    with pytest.raises(CatalogError, match=r"not in the cache; run `runner pull gemma-3-270m`"):
        store.resolve("gemma-3-270m", pull_missing=False)


def test_remove_deletes_the_file_and_refuses_what_is_not_there(store: ModelStore) -> None:
    ref = store.catalog.resolve("smollm2-135m-instruct:q8_0")
    (store.root / ref.file).write_bytes(b"GGUF")
    assert store.remove("smollm2-135m-instruct:q8_0") == [store.root / ref.file]
    assert not (store.root / ref.file).exists()
    with pytest.raises(CatalogError, match="is not in the cache"):
        store.remove("smollm2-135m-instruct:q8_0")


def test_a_file_in_the_cache_the_catalog_does_not_know_is_listed_loaded_and_removed_by_its_name(
        store: ModelStore) -> None:
    (store.root / "mine.gguf").write_bytes(b"GGUF")
    assert [c.name for c in store.cached()] == ["mine.gguf"]
    assert store.resolve("mine.gguf", pull_missing=False) == (store.root / "mine.gguf", None)  # (not found before)
    assert store.remove("mine.gguf") == [store.root / "mine.gguf"]  # (an unknown model before)
