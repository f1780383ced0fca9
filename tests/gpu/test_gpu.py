"""On a GPU build of llama.cpp with a GPU (bench/gpu/device_check.sh runs these on the device);
everywhere else they are skipped, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.runtime.gpu_fit import MARGIN_BYTES, LayerCosts, plan_offload
from runner.runtime.llama import list_devices

GPUS = [d for d in list_devices() if d.takes_layers]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not GPUS, reason="no GPU: this llama.cpp build registers none (bench/gpu/device_check.sh runs these on one)")]


def greedy_tokens(model: Path, n_gpu_layers: str, n: int = 24) -> tuple[list[int], dict]:
    from runner.python_api.runner import Runner

    with Runner(model, log=lambda _: None, n_gpu_layers=n_gpu_layers, ctx_size=256, threads=4) as r:
        ids = r.loaded.text_prompt_ids("The quick brown fox jumps over")
        events = list(r.stream(r.request(ids, max_tokens=n, temperature=0)))
        return [t for e in events for t in e.token_ids], r.loaded.facts.placement


def test_every_layer_on_the_gpu_gives_the_cpus_greedy_tokens(tiny_gguf: Path) -> None:
    on_cpu, cpu_placement = greedy_tokens(tiny_gguf, "0")
    on_gpu, gpu_placement = greedy_tokens(tiny_gguf, "-1")
    assert cpu_placement["n_gpu_layers"] == 0 and gpu_placement["n_gpu_layers"] == 3  # 2 layers + the head
    assert len(on_gpu) == 24
    assert on_gpu[:8] == on_cpu[:8]  # another backend's rounding may part them later, not at once


def test_auto_places_every_layer_of_a_small_model(tiny_gguf: Path) -> None:
    _, placement = greedy_tokens(tiny_gguf, "auto", n=4)
    assert placement["n_gpu_layers"] == 3 and placement["devices"] == [d.name for d in GPUS]


def test_auto_stops_where_this_gpus_free_memory_ends() -> None:
    room = sum(d.free_bytes - MARGIN_BYTES for d in GPUS)
    n_layer = room // (1 << 30) + 10  # more 1 GiB layers than fit
    costs = LayerCosts((1 << 30,) * n_layer, 1 << 30, (0,) * n_layer, 64 << 20)
    offload = plan_offload(None, costs, list_devices())
    assert 0 < offload.n_gpu_layers <= n_layer
    assert costs.on_gpu(offload.n_gpu_layers) <= room < costs.on_gpu(offload.n_gpu_layers + 1)

