from pathlib import Path

import pytest

from runner.core.errors import MemoryPlanError
from runner.runtime.gguf_file import read_gguf
from runner.runtime.memory_plan import MemoryPlan
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
