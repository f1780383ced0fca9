from __future__ import annotations

from pathlib import Path

import pytest

from runner.catalog.catalog import Catalog
from runner.catalog.store import ModelStore
from runner.config.options import EngineOptions
from runner.core.errors import CatalogError, ModelFileError, OptionError
from runner.router.servable import ServableModel, ggufs_in, read_models_config, servable_models

CATALOG = Catalog.load("""
default = "small"
[models.small]
file = "small.gguf"
size = 1
sha256 = "00"
variants = ["q8_0"]
[models.big]
file = "big.gguf"
size = 1
sha256 = "00"
""")


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    root = tmp_path / "cache"
    root.mkdir()
    (root / "small.gguf").write_bytes(b"GGUF")
    (root / "mine.gguf").write_bytes(b"GGUF")
    return ModelStore(CATALOG, root)


def test_no_model_named_serves_the_default_first_then_the_cache_then_the_catalog(store: ModelStore) -> None:
    models = servable_models([], EngineOptions(), store)
    assert [(m.name, m.source) for m in models] == [
        ("small", "small"), ("mine", str(store.root / "mine.gguf")), ("small:q8_0", "small:q8_0"), ("big", "big")]


def test_named_models_only_and_a_models_dir_by_file_name(store: ModelStore, tmp_path: Path, tiny_gguf: Path) -> None:
    models_dir = tmp_path / "dir"
    (models_dir / "sub").mkdir(parents=True)
    for name in ("a.gguf", "sub/b-00001-of-00002.gguf", "sub/b-00002-of-00002.gguf", "mmproj-a-f16.gguf",
                 "notes.txt"):
        (models_dir / name).write_bytes(b"GGUF")
    file = tmp_path / "x" / "file.gguf"
    file.parent.mkdir()
    file.write_bytes(tiny_gguf.read_bytes())
    models = servable_models(["big", str(file)], EngineOptions(), store, models_dir)
    assert [(m.name, m.source) for m in models] == [
        ("big", "big"), ("file", str(file)), ("a", str(models_dir / "a.gguf")),
        ("b", str(models_dir / "sub/b-00001-of-00002.gguf"))]
    assert ggufs_in(models_dir) == [models_dir / "a.gguf", models_dir / "sub/b-00001-of-00002.gguf"]


@pytest.mark.parametrize(("named", "error", "message"), [
    ("smal", CatalogError, "unknown model 'smal'; did you mean 'small'"),
    ("small:q2_k", CatalogError, "q2_k"),
    ("/no/such.gguf", ModelFileError, "model file not found: /no/such.gguf"),
    ("notes.gguf", ModelFileError, "is not a GGUF model file"),
])
def test_a_named_model_that_cannot_be_served_is_refused_at_start(store: ModelStore, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, named: str,
                                                                  error: type, message: str) -> None:
    """As `runner serve MODEL` refuses it (a catalog model not cached yet is pulled on first use)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.gguf").write_text("not a model")
    with pytest.raises(error, match=message):
        servable_models(["big", named], EngineOptions(), store)


def test_a_config_section_sets_one_models_options_aliases_pin_and_keep_alive(store: ModelStore,
                                                                             tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text('[models.big]\nctx_size = 8192\nparallel = 2\naliases = ["large"]\npin = true\n'
                      'keep_alive = "1h"\nn_gpu_layers = 20\n[models.mine2]\nmodel = "/m/x.gguf"\nkv_type = "q8_0"\n')
    models = servable_models(["small", "big"], EngineOptions(ctx_size=1024), store, config=read_models_config(config))
    small, big, mine2 = models
    assert (small.options.ctx_size, big.options.ctx_size, big.options.parallel) == (1024, 8192, 2)
    assert (big.ids, big.is_pinned, big.keep_alive_s, small.is_pinned) == (("big", "large"), True, 3600.0, False)
    assert (mine2.source, mine2.options.kv_type, mine2.options.ctx_size) == ("/m/x.gguf", "q8_0", 1024)
    assert (big.options.n_gpu_layers, small.options.n_gpu_layers) == ("20", "auto")  # a count, or auto


@pytest.mark.parametrize(("text", "message"), [
    ("[models.big]\nctx = 1\n", 'has unknown keys: ctx'),
    ("[models.big]\nctx_size = \"big\"\n", "ctx_size must be an int, got 'big'"),
    ("[models.big]\nspec = \"bogus\"\n",  # (the server started; the first request got a 500 and argparse's usage)
     '[models."big"] --spec must be one of'),
    ("[models.big]\nctx_size = 8\n", '[models."big"] --ctx-size must be at least 32, got 8'),
    ("[models.nowhere]\nctx_size = 1\n", 'is not a servable model and names no \'model\''),
    ("[models.big]\naliases = [\"small\"]\n", "the model id 'small' would name both 'small' and 'big'"),
    ("[server]\nport = 1\n", 'expected only [models."NAME"] sections'),
    ("[models.big\n", "not TOML"),
])
def test_a_bad_config_is_one_line_naming_what_is_wrong(store: ModelStore, tmp_path: Path, text: str,
                                                        message: str) -> None:
    config = tmp_path / "models.toml"
    config.write_text(text)
    with pytest.raises(OptionError, match=None) as refused:
        servable_models(["small", "big"], EngineOptions(), store, config=read_models_config(config))
    assert message in str(refused.value)


def test_v1_models_tells_a_models_inputs_from_its_projectors_header(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from runner.router.routes import _inputs
    from tiny_audio_mmproj import write_tiny_audio_mmproj
    from tiny_mmproj import write_tiny_mmproj

    state = SimpleNamespace(store=None)
    sees, hears = write_tiny_mmproj(tmp_path / "mmproj-v.gguf"), write_tiny_audio_mmproj(tmp_path / "mmproj-a.gguf")

    def inputs(mmproj: str) -> list[str]:
        return _inputs(state, ServableModel("m", "m.gguf", EngineOptions(mmproj=mmproj)))  # type: ignore[arg-type]

    assert inputs("") == ["text"]
    assert inputs(str(sees)) == ["text", "image"]
    assert inputs(str(hears)) == ["text", "audio"]
