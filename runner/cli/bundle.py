"""The single-file executable: its embedded model, the double-click launch, and `runner bundle`.

Built by PyInstaller from build_exe.spec. One-file mode unpacks into a temporary _MEI* dir
and runs this program as a child of the bootloader, which forwards Ctrl-C / SIGTERM to it and
removes the dir once it exits; so shutdown only has to end this process cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import webbrowser
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.catalog.embedded import embedded_model, is_frozen
from runner.core.errors import RunnerError

SPEC = "build_exe.spec"
# PyInstaller's one-file archive records offsets and sizes in 32 bits: the whole executable stays under
# 4 GiB, and runner itself (Python, llama.cpp, the libraries) takes ~90 MB of it
ONE_FILE_MAX_MODEL_BYTES = 2**32 - 256 * 2**20
CPU_FEATURES_FILE = "cpu_features.txt"  # written at build time: the x86 features llama.cpp was compiled for
# llama.cpp's feature names -> the flag /proc/cpuinfo shows for it
CPUINFO_FLAG = {"SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma",
                "BMI2": "bmi2", "AVX_VNNI": "avx_vnni", "AVX512": "avx512f",
                "AVX512_VBMI": "avx512vbmi",  # sic: cpuinfo spells this one without the underscore
                "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16"}


def compiled_features(system_info: str) -> list[str]:
    """The CPU features in llama.cpp's system info line ('AVX2 = 1 | ...') that the build requires."""
    out = []
    for part in system_info.split("|"):
        name, _, value = part.partition("=")
        name = name.strip().split(":")[-1].strip()
        if value.strip() == "1" and name in CPUINFO_FLAG:
            out.append(name)
    return out


def missing_features(required: list[str], cpuinfo: str) -> list[str]:
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return [f for f in required if CPUINFO_FLAG[f] not in flags]


def check_cpu() -> None:
    """In the executable: refuse with a clear line on a CPU that lacks what llama.cpp was built for
    (instead of dying with 'illegal instruction')."""
    if not is_frozen():
        return
    path = Path(sys._MEIPASS) / "runner" / CPU_FEATURES_FILE  # type: ignore[attr-defined]
    try:
        required = path.read_text().split()
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return  # not Linux, or no record: nothing to check against
    missing = missing_features(required, cpuinfo)
    if missing:
        raise RunnerError(
            f"this executable was built for CPUs with {', '.join(required)}; this CPU lacks {', '.join(missing)}. "
            "Build one on this machine with scripts/build_exe.sh"
        )


def _browser_env() -> dict[str, str]:
    """The environment the user had: the bootloader points LD_LIBRARY_PATH at our bundled libraries."""
    env = dict(os.environ)
    original = env.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is not None:
        env["LD_LIBRARY_PATH"] = original
    else:
        env.pop("LD_LIBRARY_PATH", None)
    return env


def open_browser(url: str) -> None:
    """Open the chat page in the user's browser, saying so, or, where none is found, say where it is."""
    with _user_environment():
        try:
            browser = webbrowser.get()
        except webbrowser.Error:  # (no display, no browser installed)
            browser = None
    if browser is None:
        print(f"runner: the chat is at {url}: open it in a browser; press Ctrl-C here to stop", file=sys.stderr,
              flush=True)
        return
    print(f"runner: opening {url} in your browser; press Ctrl-C here to stop", file=sys.stderr, flush=True)

    def launch() -> None:
        with _user_environment():
            try:
                browser.open(url)
            except Exception:  # noqa: BLE001 - a browser that fails to start is not an error: the URL is printed
                pass

    threading.Thread(target=launch, daemon=True).start()


@contextlib.contextmanager
def _user_environment() -> Iterator[None]:
    """os.environ as the user had it, for the while (webbrowser reads it, and starts the browser with it)."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(_browser_env())
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def double_click(parse_args: Callable[[list[str]], argparse.Namespace]) -> int:
    """No arguments: serve the embedded model on a free localhost port and open the chat page
    (parse_args: the `runner` command line's parser)."""
    if embedded_model() is None:
        raise RunnerError("this executable carries no model; run it with a command, e.g. `runner chat model.gguf`")
    from runner.router.serve import cmd_serve_models

    args = parse_args(["serve", "--port", "0"])  # no MODEL: the one it carries
    return cmd_serve_models(args, on_ready=None if os.environ.get("RUNNER_NO_BROWSER") else open_browser)


def cmd_bundle(args: argparse.Namespace) -> int:
    """`runner bundle MODEL -o NAME`: a one-file executable carrying another model (a path, a catalog
    name or a Hub reference)."""
    from runner.catalog.store import ModelStore
    from runner.runtime.gguf_file import read_gguf

    model = ModelStore().resolve(args.model)[0].resolve()
    if read_gguf(model).n_splits > 1:
        raise RunnerError(f"{model.name} is one part of a split GGUF; a bundle carries one file (merge the parts "
                          "with llama.cpp's gguf-split --merge first)")
    size = model.stat().st_size
    if size > ONE_FILE_MAX_MODEL_BYTES:
        limit = ONE_FILE_MAX_MODEL_BYTES / 2**30
        raise RunnerError(f"{model.name} is {size / 2**30:.1f} GiB: a one-file executable holds {limit:.2f} GiB of "
                          "model at most (PyInstaller's archive stays under 4 GiB in all); bundle a smaller quant, "
                          "or serve this one with `runner serve`")
    out = Path(args.output).expanduser().resolve()
    if out.is_dir():  # (PyInstaller would write into it, or over it)
        raise RunnerError(f"-o {args.output} is a directory: name the executable, e.g. -o {out / 'runner-chat'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunnerError(f"cannot write {out}: {exc.strerror}") from None
    if not os.access(out.parent, os.W_OK):
        raise RunnerError(f"cannot write {out}: {out.parent} is not writable")
    repo = Path(__file__).resolve().parents[2]
    spec = repo / SPEC
    if not spec.exists():
        raise RunnerError(f"{SPEC} is not next to the runner package ({repo}); bundle from a source checkout")
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        raise RunnerError("PyInstaller is not installed: pip install pyinstaller") from None
    # zlib level 6, not PyInstaller's 9, for the libraries it compresses: 7 s instead of 25 here, 0.4 MB larger
    env = {"PYINSTALLER_ZLIB_COMPRESSION_LEVEL": "6", **os.environ,
           "RUNNER_BUNDLE_MODEL": str(model), "RUNNER_BUNDLE_NAME": out.name}
    # PyInstaller's work folder holds a copy of everything, the model too: beside the output (the same
    # disk), and removed after
    with tempfile.TemporaryDirectory(prefix=f".build-{out.name}-", dir=out.parent) as work:
        cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--distpath", str(out.parent),
               "--workpath", work, str(spec)]
        if subprocess.run(cmd, env=env, cwd=repo).returncode != 0:
            raise RunnerError("PyInstaller failed (its output is above)")
    print(f"built {out} ({out.stat().st_size / 1e6:.0f} MB) carrying {model.name}")
    return 0
