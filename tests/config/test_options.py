"""Options declared once: physical cores for --threads."""

from __future__ import annotations

import os

import pytest

from runner.config.options import EngineOptions, physical_cores


def cpuinfo(pairs: list[tuple[int, int]]) -> str:
    return "".join(f"processor\t: {i}\nphysical id\t: {p}\ncore id\t\t: {c}\n\n" for i, (p, c) in enumerate(pairs))


def test_threads_default_to_physical_cores_not_hardware_threads() -> None:
    two_sockets_smt = [(p, c) for p in (0, 1) for c in (0, 1) for _ in range(2)]  # 2 x 2 cores, 2 threads each
    assert physical_cores(cpuinfo(two_sockets_smt)) == 4
    assert physical_cores("processor\t: 0\n") == (os.cpu_count() or 1)  # no topology (some VMs, ARM)
    assert EngineOptions().threads == physical_cores()


def test_flash_attention_as_asked_but_on_for_a_quantized_kv_cache() -> None:
    from runner.config.options import EngineOptions, flash_attention
    from runner.core.errors import OptionError

    assert flash_attention(EngineOptions()) == "auto"
    assert flash_attention(EngineOptions(flash_attn="off")) == "off"
    assert flash_attention(EngineOptions(kv_type="q8_0")) == "on"
    with pytest.raises(OptionError, match="needs flash attention"):
        flash_attention(EngineOptions(kv_type="q8_0", flash_attn="off"))


def test_batch_invariant_mode_keeps_micro_batches_under_flash_attentions_64_rows() -> None:
    from runner.config.options import EngineOptions, micro_batch_max

    assert micro_batch_max(EngineOptions()) == 512
    assert micro_batch_max(EngineOptions(batch_invariant="on")) == 63


def test_options_a_model_cannot_start_with_are_refused_by_name() -> None:
    """(a made-up choice was a KeyError or silently off; ctx 1 and batch < parallel aborted in llama.cpp)"""
    from runner.core.errors import OptionError

    for options, message in [({"kv_type": "bogus"}, "--kv-type must be one of 'f16', 'q8_0', 'q4_0'; got 'bogus'"),
                             ({"swa_full": "yes"}, "--swa-full must be one of"),
                             ({"jump_forward": "bogus"}, "--jump-forward must be one of"),
                             ({"ctx_size": 1}, "--ctx-size must be at least 32, got 1"),
                             ({"batch_size": 1}, "--batch-size must be at least 2"),
                             ({"batch_size": 2, "parallel": 4}, r"--batch-size must be at least --parallel \(4\)")]:
        with pytest.raises(OptionError, match=message):
            EngineOptions(**options)
    assert EngineOptions(batch_size=4, parallel=4, ctx_size=32).batch_size == 4
