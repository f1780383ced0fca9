"""Options declared once: physical cores for --threads."""

from __future__ import annotations

import os

from runner.config.options import EngineOptions, physical_cores


def cpuinfo(pairs: list[tuple[int, int]]) -> str:
    return "".join(f"processor\t: {i}\nphysical id\t: {p}\ncore id\t\t: {c}\n\n" for i, (p, c) in enumerate(pairs))


def test_threads_default_to_physical_cores_not_hardware_threads() -> None:
    two_sockets_smt = [(p, c) for p in (0, 1) for c in (0, 1) for _ in range(2)]  # 2 x 2 cores, 2 threads each
    assert physical_cores(cpuinfo(two_sockets_smt)) == 4
    assert physical_cores("processor\t: 0\n") == (os.cpu_count() or 1)  # no topology (some VMs, ARM)
    assert EngineOptions().threads == physical_cores()
