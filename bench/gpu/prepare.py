"""Prepare, on this machine, what the GPU device check carries to the device (`.gpu/`, ignored by git):

- `llama.cpp.tar.gz`: the llama.cpp vendored in the llama-cpp-python we pin, trimmed to what a
  CUDA build of its libraries, llama-server and llama-quantize needs (no models, docs, tests, other
  backends), and llama-cpp-python's own Python package (`llama_cpp/`), which loads the libraries
  built there through LLAMA_CPP_LIB_PATH;
- `wheels/`: runner's Python dependencies that the device's Python 3.12 lacks.

    python bench/gpu/prepare.py [--out .gpu]

Then, on a session that holds a device: the `run` tool with carry [".gpu"] and the command
`bash bench/gpu/device_check.sh` (README in bench/gpu/). The device has no network: everything
it needs is here. The whole working tree travels too; the total must stay under 64 MiB.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CARRY_LIMIT = 64 << 20  # the device tool's limit on what travels (working tree + carried paths)
# what the device's Python 3.12 lacks of runner's dependencies (it has numpy, jinja2, tqdm, httpx,
# huggingface_hub, pyyaml, pytest, anyio, h11, click: the device README's package list)
WHEELS = ("starlette", "uvicorn", "platformdirs", "gguf", "llguidance", "typing_extensions")
# llama.cpp's top-level folders a library + server + quantize build does not read
# (tests and examples are CMake options the build turns off; scripts/ holds CMake helpers it runs)
_DROP_TOP = {"models", "docs", "tests", "benches", "examples", "media", "gguf-py", "conversion", "requirements",
             ".devops", ".github", "skills", "grammars", "ci"}
# backends other than the CPU's and CUDA's
_KEEP_BACKENDS = {"ggml-cpu", "ggml-cuda"}


def keeps(relative: str) -> bool:
    """Whether a path inside vendor/llama.cpp goes into the carried source."""
    parts = relative.split("/")
    if parts[0] in _DROP_TOP:
        return False
    if parts[:2] == ["ggml", "src"] and len(parts) > 3 and parts[2].startswith("ggml-") \
            and parts[2] not in _KEEP_BACKENDS:
        return False  # another backend's folder (its CMake is only read when that backend is on)
    if parts[0] == "tools" and len(parts) > 2 and parts[2] in ("tests", "test", "screenshots"):
        return False
    return True


def sdist(version: str, cache: Path) -> Path:
    """llama-cpp-python's source distribution of `version` (from pip's cache where it is there)."""
    archive = cache / f"llama_cpp_python-{version}.tar.gz"
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                        "-d", str(cache), f"llama-cpp-python=={version}"], check=True)
    return archive


def trimmed_source(archive: Path, out: Path) -> int:
    """Write out/llama.cpp.tar.gz: llama.cpp/ (trimmed) and llama_cpp/ (the Python package)."""
    kept = 0
    with tarfile.open(archive) as src, tarfile.open(out / "llama.cpp.tar.gz", "w:gz", compresslevel=9) as dst:
        for member in src:
            top, _, rest = member.name.partition("/")  # llama_cpp_python-X.Y.Z/...
            if rest.startswith("vendor/llama.cpp/"):
                inner = rest.removeprefix("vendor/llama.cpp/")
                name = "llama.cpp/" + inner
                if not keeps(inner):
                    continue
            elif rest.startswith("llama_cpp/") and not rest.startswith("llama_cpp/server/"):
                name = rest
            else:
                continue
            data = src.extractfile(member) if member.isfile() else None
            member.name = name
            dst.addfile(member, io.BytesIO(data.read()) if data else None)
            kept += member.size if member.isfile() else 0
    return kept


def wheels(out: Path) -> None:
    target = out / "wheels"
    target.mkdir(parents=True, exist_ok=True)
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                                             "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "any")]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(target),
                    *WHEELS], check=True)


def tree_bytes(repo: Path) -> int:
    """What the device tool sends of the checkout: tracked and untracked-not-ignored files."""
    names = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((repo / n.decode()).stat().st_size for n in names if n and (repo / n.decode()).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / ".gpu")
    ap.add_argument("--sdist-cache", type=Path, default=REPO / ".cache" / "gpu")
    ap.add_argument("--no-wheels", action="store_true", help="the source only (what the test checks)")
    args = ap.parse_args()
    import llama_cpp

    args.out.mkdir(parents=True, exist_ok=True)
    kept = trimmed_source(sdist(llama_cpp.__version__, args.sdist_cache), args.out)
    if not args.no_wheels:
        wheels(args.out)
    carried, tree = folder_bytes(args.out), tree_bytes(REPO)
    mib = lambda n: f"{n / (1 << 20):.1f} MiB"  # noqa: E731
    print(f"llama.cpp {llama_cpp.__version__}: {mib(kept)} of source kept, {mib((args.out / 'llama.cpp.tar.gz').stat().st_size)} "
          f"compressed; {args.out.name}/ {mib(carried)} + working tree {mib(tree)} = {mib(carried + tree)} "
          f"(limit {mib(CARRY_LIMIT)})")
    if carried + tree > CARRY_LIMIT:
        sys.exit("too large to carry to the device")


if __name__ == "__main__":
    main()
