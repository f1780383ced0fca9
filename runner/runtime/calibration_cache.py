"""calibration.json in the model cache: load-time measurements kept per model file, threads and machine."""

from __future__ import annotations

import contextlib
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.runtime.calibration import SEQ_COUNTS

CALIBRATION_FILE = "calibration.json"
CALIBRATION_VERSION = "v4"  # bumped when calibration.measure() changes: older entries are measured again, and dropped


def cached_json(cache_dir: Path | None, key: str, make: Callable[[], Any]) -> Any:
    """The calibration file's entry for `key`, measured by make() and stored when missing (where the
    cache directory can be written: None, or a read-only one, keeps nothing)."""
    if cache_dir is None:
        return make()
    path = cache_dir / CALIBRATION_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if key in data:
        return data[key]
    value = make()
    data = {k: v for k, v in data.items() if k.startswith(CALIBRATION_VERSION + ":")}
    data[key] = value
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # several processes (a router's models) may write at once
    try:
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return value


def _file_key(path: Path) -> str:
    stat = path.stat()
    return f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}"


def calibration_key(model_path: Path, n_threads: int, n_gpu_layers: int, n_seq: int, n_ubatch: int,
                    placement: str = "", part: str = "") -> str:
    """`placement`: where the layers run beyond this machine (--rpc's workers and split), if anywhere;
    `part`: which of the file's layers the context runs where not all (its MTP layers: 'mtp')."""
    return (f"{CALIBRATION_VERSION}:{_file_key(model_path)}:t{n_threads}:g{n_gpu_layers}"
            f":s{min(n_seq, max(SEQ_COUNTS))}:u{n_ubatch}:{platform.machine()}:{platform.node()}"
            + (f":rpc={placement}" if placement else "") + (f":{part}" if part else ""))


def agreement_key(target_path: Path, draft_path: Path) -> str:
    """A pair's draft agreement depends on the two files only (not threads or machine)."""
    return f"{CALIBRATION_VERSION}:agreement:{_file_key(target_path)}:{_file_key(draft_path)}"


def vocabulary_key(model_path: Path) -> str:
    """What a scan of the model's vocabulary found (its longest token), per file."""
    return f"{CALIBRATION_VERSION}:vocabulary:{_file_key(model_path)}"
