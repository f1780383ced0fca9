from pathlib import Path

import pytest
from gguf import GGUFWriter

from runner.core.errors import ModelFileError
from runner.runtime.gguf_file import read_gguf


def test_reads_tiny_model_header(tiny_gguf: Path) -> None:
    info = read_gguf(tiny_gguf)
    assert info.architecture == "llama"
    assert info.quant_type == "ALL_F32"
    assert info.n_vocab == 264
    assert info.n_ctx_train == 2048
    assert info.arch_value("block_count") == 2
    assert info.has_chat_template
    assert info.data_end == info.file_size


def test_truncated_file_is_refused_with_sizes(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size - 1000])
    with pytest.raises(ModelFileError, match=r"truncated or corrupt: its tensors need [\d,]+ bytes but the file has [\d,]+"):
        read_gguf(cut)


def test_truncated_header_is_refused(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:300])
    with pytest.raises(ModelFileError, match="truncated GGUF header"):
        read_gguf(cut)


def test_not_a_gguf(tmp_path: Path) -> None:
    other = tmp_path / "notes.gguf"
    other.write_text("hello")
    with pytest.raises(ModelFileError, match="is not a GGUF model file"):
        read_gguf(other)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="model file not found"):
        read_gguf(tmp_path / "nope.gguf")


def header_only(path: Path, **values: object) -> Path:
    """A GGUF with no tensors and the given metadata (strings and ints)."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    for key, value in values.items():
        name = key.replace("__", ".")
        if isinstance(value, str):
            w.add_string(name, value)
        else:
            w.add_int32(name, int(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", ["wide", 0, -32])
def test_a_nonsense_alignment_is_one_line(tmp_path: Path, alignment: object) -> None:
    path = header_only(tmp_path / "odd.gguf", general__alignment=alignment)
    with pytest.raises(ModelFileError, match=r"corrupt GGUF metadata \(general.alignment is"):
        read_gguf(path)


def test_counts_of_the_wrong_type_read_as_unknown(tmp_path: Path) -> None:
    from runner.config.options import EngineOptions
    from runner.runtime.memory_plan import MemoryPlan

    info = read_gguf(header_only(tmp_path / "odd.gguf", llama__context_length="long", llama__block_count="many",
                                 llama__attention__head_count=-4))
    assert (info.n_ctx_train, info.n_vocab, info.arch_int("block_count", 0)) == (0, 0, 0)
    MemoryPlan.for_model(info, EngineOptions(), available_bytes=1 << 40).check()  # no traceback


def test_a_window_pattern_array_longer_than_any_model_has_layers_is_a_corrupt_header(tmp_path: Path) -> None:
    w = GGUFWriter(str(tmp_path / "bad.gguf"), "gemma3")
    w.add_block_count(4)
    w.add_array("gemma3.attention.sliding_window_pattern", [True] * 600)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="an array of 600 values where one per layer, at most 512"):
        read_gguf(tmp_path / "bad.gguf")


def test_a_window_pattern_array_running_past_the_end_is_a_truncated_header(tmp_path: Path) -> None:
    w = GGUFWriter(str(tmp_path / "cut.gguf"), "gemma3")
    w.add_array("gemma3.attention.sliding_window_pattern", [True] * 12)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    whole = (tmp_path / "cut.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:-6])  # (the array's last 6 flags are missing)
    with pytest.raises(ModelFileError, match="truncated GGUF header"):
        read_gguf(tmp_path / "cut.gguf")


def test_a_split_models_first_part_counts_every_parts_tensors(tmp_path: Path) -> None:
    from tiny_gguf import write_tiny_gguf

    whole = read_gguf(write_tiny_gguf(tmp_path / "whole" / "tiny.gguf", seed=3))
    first = write_tiny_gguf(tmp_path / "split" / "tiny.gguf", seed=3, split_max_tensors=8)
    parts = sorted(first.parent.glob("*.gguf"))
    split = read_gguf(parts[0])
    assert split.n_splits == len(parts) == 3 and split.part_paths == parts
    assert split.n_params == whole.n_params  # (it was the first part's alone)
    assert split.layer_weight_bytes == whole.layer_weight_bytes
    assert (split.output_weight_bytes, split.embedding_bytes) == (whole.output_weight_bytes, whole.embedding_bytes)
    assert read_gguf(parts[1]).n_params < whole.n_params  # a later part alone is read as itself
