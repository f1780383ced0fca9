import dataclasses
from pathlib import Path

import pytest
from gguf import GGUFWriter

from runner.core.errors import MemoryPlanError
from runner.runtime.gguf_file import read_gguf
from runner.runtime.memory_plan import MemoryPlan, draft_options, layer_costs, window_cells, window_layers
from runner.config.options import EngineOptions


def test_kv_bytes_follow_layers_heads_context_and_type(tiny_gguf: Path) -> None:
    info = read_gguf(tiny_gguf)
    plan = MemoryPlan.for_model(info, EngineOptions(parallel=3, ctx_size=1000, kv_type="f16"), available_bytes=1 << 40)
    # 2 layers x 2 KV heads x (16 + 16) dims x 2 bytes per token
    assert plan.kv_per_slot_bytes == 2 * 2 * 32 * 2 * 1000
    assert plan.weights_bytes == tiny_gguf.stat().st_size
    assert plan.total_bytes == plan.weights_bytes + 3 * plan.kv_per_slot_bytes + plan.compute_bytes
    q8 = MemoryPlan.for_model(info, EngineOptions(parallel=3, ctx_size=1000, kv_type="q8_0"), available_bytes=1 << 40)
    assert q8.kv_per_slot_bytes == 2 * 2 * 32 * 1000 * 34 // 32


def test_refuses_with_numbers_and_suggestions(tiny_gguf: Path) -> None:
    plan = MemoryPlan.for_model(read_gguf(tiny_gguf), EngineOptions(parallel=4, ctx_size=4096), available_bytes=10 << 20)
    assert not plan.fits
    with pytest.raises(MemoryPlanError) as err:
        plan.check()
    text = str(err.value)
    assert "x 4 slots" in text and "(available: 10 MiB)" in text
    assert "--parallel" in text and "--ctx-size" in text and "--kv-type q8_0" in text


def test_a_draft_model_adds_its_weights_kv_and_compute(tiny_gguf: Path) -> None:
    info = read_gguf(tiny_gguf)
    opts = EngineOptions(parallel=2, ctx_size=512)
    target = MemoryPlan.for_model(info, opts, available_bytes=1 << 40)
    both = target.with_draft(MemoryPlan.for_model(info, opts, available_bytes=1 << 40))
    assert both.weights_bytes == 2 * target.weights_bytes
    assert both.total_bytes == 2 * target.total_bytes


def _windowed_header(path: Path, arch: str, pattern: int | list[bool] | None = None, n_layer: int = 12) -> Path:
    """A weightless GGUF header of a sliding-window model: 1 KV head of 256 + 256 dims (1 KiB a cell
    and layer in f16), a 512-token window."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_embedding_length(640)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(256)
    w.add_value_length(256)
    w.add_sliding_window(512)
    if isinstance(pattern, int):
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", pattern)
    elif pattern is not None:
        w.add_array(f"{arch}.attention.sliding_window_pattern", pattern)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_sliding_window_layers_are_planned_at_their_window_with_a_checkpoint_and_whole_for_a_draft(tmp_path: Path) -> None:
    info = read_gguf(_windowed_header(tmp_path / "g.gguf", "gemma3"))  # every sixth layer global: 10 of 12 slide
    assert window_layers(info) == 10
    opts = EngineOptions(parallel=2, ctx_size=32768, kv_type="f16")
    assert window_cells(info, opts) == 1024  # the window and a 512-token micro-batch
    plan = MemoryPlan.for_model(info, opts, available_bytes=1 << 40)
    assert plan.kv_per_slot_bytes == 1024 * (2 * 32768 + 10 * 1024)
    assert plan.checkpoint_per_slot_bytes == 1024 * 10 * 1024
    assert plan.total_bytes == plan.weights_bytes + 2 * (plan.kv_per_slot_bytes + plan.checkpoint_per_slot_bytes) + plan.compute_bytes
    assert "(+ window checkpoint 10 MiB) x 2 slots" in plan.describe()
    whole = MemoryPlan.for_model(info, dataclasses.replace(opts, swa_full="on"), available_bytes=1 << 40)
    assert (whole.kv_per_slot_bytes, whole.checkpoint_per_slot_bytes) == (1024 * 12 * 32768, 0)
    draft = MemoryPlan.for_draft(info, opts)
    assert (draft.kv_per_slot_bytes, draft.checkpoint_per_slot_bytes) == (whole.kv_per_slot_bytes, 0)
    short = EngineOptions(parallel=1, ctx_size=700, kv_type="f16")  # a context shorter than window + batch
    assert window_cells(info, short) == 768


def test_a_stated_window_pattern_wins_and_an_unknown_windowed_architecture_is_planned_whole(tmp_path: Path) -> None:
    assert window_layers(read_gguf(_windowed_header(tmp_path / "a.gguf", "gemma3", pattern=2))) == 6
    flags = [True, True, False, True, False, False, True, False]
    assert window_layers(read_gguf(_windowed_header(tmp_path / "b.gguf", "gemma3", pattern=flags, n_layer=8))) == 4
    assert window_layers(read_gguf(_windowed_header(tmp_path / "c.gguf", "gemma2", n_layer=8))) == 4
    unknown = read_gguf(_windowed_header(tmp_path / "d.gguf", "mistral3", pattern=2))  # (a layout llama.cpp may not read)
    assert window_layers(unknown) == 0
    plan = MemoryPlan.for_model(unknown, EngineOptions(ctx_size=4096, batch_size=512, kv_type="f16"),
                                available_bytes=1 << 40)
    assert (plan.kv_per_slot_bytes, plan.checkpoint_per_slot_bytes) == (1024 * 12 * 4096, 0)  # every layer whole


def test_a_gpu_holding_the_last_layers_holds_their_own_kv(tmp_path: Path) -> None:
    """llama.cpp offloads the last layers: where full-attention and window layers alternate, those
    hold their own KV, not the mean (gemma 3: layers 5 and 11 of 12 keep the whole context)."""
    info = read_gguf(_windowed_header(tmp_path / "g.gguf", "gemma3"))
    opts = EngineOptions(parallel=2, ctx_size=32768, batch_size=512, kv_type="f16")
    costs = layer_costs(info, opts)
    whole, window = 2 * 1024 * 32768, 2 * 1024 * 1024
    assert costs.layer_kv == (window,) * 5 + (whole,) + (window,) * 5 + (whole,)
    assert sum(costs.layer_kv) == 2 * MemoryPlan.for_model(info, opts, available_bytes=1 << 40).kv_per_slot_bytes
    # (n_gpu_layers 1: the output head alone; 2: and the last layer, a full-attention one; 3: and a window layer)
    assert costs.on_gpu(2) - costs.on_gpu(1) == costs.layer_weights[11] + whole
    assert costs.on_gpu(3) - costs.on_gpu(2) == costs.layer_weights[10] + window
    draft = layer_costs(info, draft_options(opts))  # a draft's layers keep the whole context
    assert draft.layer_kv == (whole,) * 12


@pytest.mark.model
def test_gemma_3s_plan_is_the_kv_llama_cpp_allocates(gemma_path: Path) -> None:
    info = read_gguf(gemma_path)
    plan = MemoryPlan.for_model(info, EngineOptions(parallel=2, ctx_size=32768, kv_type="f16"), available_bytes=1 << 40)
    # llama.cpp's log for this context (2 sequences of 32,768, swa_full off): 192 MiB for the 3
    # full-attention layers' 32,768 cells, 30 MiB for the 15 sliding ones' 1,024
    assert plan.kv_per_slot_bytes * 2 == (192 + 30) << 20


def test_the_ngram_store_is_in_the_plan(tiny_gguf: Path) -> None:
    """(it was not: a 64 GiB store was accepted on a 23 GiB machine, a huge one a numpy traceback)"""
    info = read_gguf(tiny_gguf)
    plain = MemoryPlan.for_model(info, EngineOptions(ngram_store_mb=4096), available_bytes=1 << 40)
    assert plain.ngram_store_bytes == 0  # (no store without --draft ngram)
    plan = MemoryPlan.for_model(info, EngineOptions(draft="ngram", ngram_store_mb=4096), available_bytes=8 << 30)
    assert plan.total_bytes == plain.total_bytes + (4096 << 20)
    assert "+ n-gram store 4,096 MiB =" in plan.describe()
    with pytest.raises(MemoryPlanError, match=r"or n-gram store \(--ngram-store-mb\)"):
        dataclasses.replace(plan, available_bytes=2 << 30).check()
