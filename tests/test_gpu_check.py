"""The GPU device check's preparation (bench/gpu/prepare.py): what it carries to the device holds
what a CUDA build of llama.cpp needs, and fits the device tool's 64 MiB with the working tree."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
import prepare  # noqa: E402

WHEELS_ALLOWANCE = 8 << 20  # .gpu/wheels: ~3.5 MiB today (llguidance the largest)


@pytest.mark.parametrize(("path", "kept"), [
    ("CMakeLists.txt", True),
    ("src/llama-model.cpp", True),
    ("src/models/llama.cpp", True),  # the architectures' sources, not the top-level test vocabularies
    ("ggml/src/ggml-cuda/fattn.cu", True),
    ("ggml/src/ggml-cpu/ggml-cpu.c", True),
    ("ggml/src/ggml.c", True),
    ("ggml/src/ggml-vulkan/ggml-vulkan.cpp", False),
    ("ggml/src/ggml-metal/ggml-metal.m", False),
    ("tools/server/server.cpp", True),
    ("tools/server/tests/unit/test_basic.py", False),
    ("scripts/ui-assets.cmake", True),  # run by the build
    ("models/ggml-vocab-llama-bpe.gguf", False),
    ("docs/build.md", False),
    ("tests/test-backend-ops.cpp", False),
])
def test_the_trim_keeps_what_the_build_reads(path: str, kept: bool) -> None:
    assert prepare.keeps(path) is kept


@pytest.mark.slow
def test_the_carried_source_builds_from_the_pinned_sdist_and_fits_the_device_limit(tmp_path: Path) -> None:
    import llama_cpp

    archive = prepare.sdist(llama_cpp.__version__, REPO / ".cache" / "gpu")  # pip's download (its cache first)
    prepare.trimmed_source(archive, tmp_path)
    carried = tmp_path / "llama.cpp.tar.gz"
    with tarfile.open(carried) as tar:
        names = set(tar.getnames())
    for needed in ("llama.cpp/CMakeLists.txt", "llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt",
                   "llama.cpp/tools/server/CMakeLists.txt", "llama.cpp/tools/quantize/CMakeLists.txt",
                   "llama.cpp/scripts/ui-assets.cmake", "llama_cpp/llama_cpp.py", "llama_cpp/_ctypes_extensions.py"):
        assert needed in names, needed
    assert not any(n.startswith(("llama.cpp/models/", "llama.cpp/ggml/src/ggml-vulkan/")) for n in names)
    total = carried.stat().st_size + WHEELS_ALLOWANCE + prepare.tree_bytes(REPO)
    assert total < prepare.CARRY_LIMIT, f"{total / (1 << 20):.1f} MiB would travel"
