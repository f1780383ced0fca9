"""--n-gpu-layers auto: how many layers a GPU's free memory holds, from made-up device figures (no
GPU needed), and a model loaded with a made-up GPU saying where its layers went."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.config.options import EngineOptions
from runner.core.errors import MemoryPlanError
from runner.runtime.devices import Device
from runner.runtime.gguf_file import read_gguf
from runner.runtime.gpu_fit import MARGIN_BYTES, LayerCosts, parse_gpu_layers, plan_offload
from runner.runtime.memory_plan import MemoryPlan, layer_costs

CPU = Device("CPU", "a CPU", "cpu", 64 << 30, 64 << 30)
COSTS = LayerCosts(layer_weights=(10, 20, 30), output_weights=5, layer_kv=(2, 2, 2), compute=7)


def gpu(free: int, name: str = "CUDA0") -> Device:
    return Device(name, "a GPU", "gpu", MARGIN_BYTES + free, 80 << 30)


def test_layers_are_counted_as_llama_cpp_counts_them_from_the_output_head_down() -> None:
    # k=1: the output head (and the compute buffer); k=2: + the LAST layer and its KV; ...
    assert [COSTS.on_gpu(k) for k in range(5)] == [0, 5 + 7, 5 + 30 + 2 + 7, 5 + 50 + 4 + 7, 5 + 60 + 6 + 7]
    assert COSTS.on_gpu(-1) == COSTS.on_gpu(9) == COSTS.on_gpu(4)


@pytest.mark.parametrize(("free", "expected"), [(11, 0), (12, 1), (43, 1), (44, 2), (77, 3), (78, 4), (10**9, 4)])
def test_auto_places_as_many_layers_as_the_free_memory_holds_after_the_margin(free: int, expected: int) -> None:
    offload = plan_offload(None, COSTS, [CPU, gpu(free)])
    assert offload.n_gpu_layers == expected and offload.auto
    assert offload.gpu_bytes == COSTS.on_gpu(expected) <= free


def test_without_a_gpu_everything_stays_on_the_cpu_whatever_was_asked() -> None:
    for wanted in (None, -1, 12):
        offload = plan_offload(wanted, COSTS, [CPU])
        assert (offload.n_gpu_layers, offload.gpu_bytes, offload.is_offloaded) == (0, 0, False)
        assert offload.describe() == "no GPU: every layer on the CPU"


def test_a_count_that_cannot_fit_is_refused_saying_what_would() -> None:
    with pytest.raises(MemoryPlanError) as refused:
        plan_offload(-1, COSTS, [CPU, gpu(50)])
    assert "--n-gpu-layers -1 needs" in str(refused.value) and ": 2 would fit" in str(refused.value)
    assert plan_offload(2, COSTS, [CPU, gpu(50)]).n_gpu_layers == 2


def test_several_gpus_pool_their_room_each_keeping_its_margin_and_a_draft_gets_what_is_left() -> None:
    two = [CPU, gpu(40, "CUDA0"), gpu(38, "CUDA1")]
    assert plan_offload(None, COSTS, two).n_gpu_layers == 4  # 78 bytes in all
    assert plan_offload(None, COSTS, two, reserved=34).n_gpu_layers == 2  # 44 left: a target took 34
    assert plan_offload(None, COSTS, two, reserved=35).n_gpu_layers == 1
    assert "CUDA0" in plan_offload(None, COSTS, two).describe() and "CUDA1" in plan_offload(None, COSTS, two).describe()


@pytest.mark.parametrize(("text", "value"), [("auto", None), ("-1", -1), ("0", 0), ("12", 12)])
def test_the_flag_reads_auto_all_or_a_count(text: str, value: int | None) -> None:
    assert parse_gpu_layers(text) == value


@pytest.mark.parametrize("text", ["-2", "most", "1.5", ""])
def test_the_flag_refuses_anything_else(text: str) -> None:
    with pytest.raises(MemoryPlanError, match="--n-gpu-layers must be auto, -1"):
        parse_gpu_layers(text)


def test_a_gguf_s_layers_kv_and_head_add_up(tiny_gguf: Path) -> None:
    info = read_gguf(tiny_gguf)
    opts = EngineOptions(parallel=3, ctx_size=1000)
    costs = layer_costs(info, opts)
    plan = MemoryPlan.for_model(info, opts, available_bytes=1 << 40)
    assert costs.n_layer == 2 and costs.layer_weights[0] == costs.layer_weights[1] > 0
    assert costs.layer_kv[0] == costs.layer_kv[1] and sum(costs.layer_kv) == plan.kv_per_slot_bytes * 3
    n_vocab, n_embd = info.n_vocab, 64
    assert costs.output_weights == n_vocab * n_embd * 4 + n_embd * 4  # output.weight + output_norm, F32
    # every tensor is a layer's, the head's or the token embeddings (which stay on the CPU)
    assert sum(costs.layer_weights) + costs.output_weights + n_vocab * n_embd * 4 == info.data_end - _data_start(info)


def _data_start(info) -> int:  # type: ignore[no-untyped-def]
    return info.data_end - sum(_tensor_bytes(info))


def _tensor_bytes(info) -> list[int]:  # type: ignore[no-untyped-def]
    from gguf import GGUFReader

    return [int(t.n_bytes) for t in GGUFReader(info.path).tensors]


def test_what_goes_to_the_gpu_leaves_ram(tiny_gguf: Path) -> None:
    info = read_gguf(tiny_gguf)
    opts = EngineOptions(parallel=2, ctx_size=512)
    offload = plan_offload(-1, layer_costs(info, opts), [CPU, gpu(1 << 30)])
    plan = MemoryPlan.for_model(info, opts, available_bytes=1 << 40, offload=offload)
    assert plan.ram_bytes == plan.total_bytes - offload.gpu_bytes + plan.compute_bytes
    tight = MemoryPlan.for_model(info, opts, available_bytes=plan.ram_bytes, offload=offload)
    assert tight.fits and not MemoryPlan.for_model(info, opts, available_bytes=plan.ram_bytes).fits
    assert "GPU CUDA0" in plan.describe() and "all 2 layers and the output head" in plan.describe()


def test_a_model_loaded_beside_a_made_up_gpu_reports_its_placement(tiny_gguf: Path) -> None:
    from runner.model.loaded_model import LoadedModel

    lines: list[str] = []
    loaded = LoadedModel(tiny_gguf, EngineOptions(parallel=1, ctx_size=64, batch_size=32, threads=1), log=lines.append,
                         devices=[CPU, gpu(8 << 30)])
    try:
        assert loaded.facts.placement == {"n_gpu_layers": 3, "layers": 2, "gpu_bytes": loaded.offload.gpu_bytes,
                                          "devices": ["CUDA0"], "auto": True}
        assert any("all 2 layers and the output head" in line for line in lines)
    finally:
        loaded.close()
