"""The one-file executable vs running from the venv: size, cold start to first token, decode speed.

    python bench/executable.py dist/runner [--repeats 3]

Cold start: from starting the process to the first byte of the reply on stdout (the exe also
unpacks itself). Decode: tok/s from `--stats` over a 128-token greedy reply. Interleaved runs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path, print_table  # noqa: E402


def first_byte_s(cmd: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.read(1)
    elapsed = time.perf_counter() - started
    proc.stdout.read()
    proc.wait()
    return elapsed


def decode_tps(cmd: list[str]) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    return float(re.search(r"([\d.]+) tok/s", out).group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = str(model_path("smollm2-135m-instruct"))
    exe = os.path.abspath(args.exe)
    faces = {"venv (python -m runner)": [sys.executable, "-m", "runner"], "executable": [exe]}
    start: dict[str, list[float]] = {k: [] for k in faces}
    speed: dict[str, list[float]] = {k: [] for k in faces}
    for _ in range(args.repeats):
        for name, base in faces.items():
            target = [] if name == "executable" else [model]  # the exe uses its embedded copy
            start[name].append(first_byte_s([*base, "run", *target, "-p", "Hello", "--max-tokens", "8", "-q"]))
            speed[name].append(decode_tps([*base, "run", *target, "-p", "Write a long story about a ship.",
                                           "--max-tokens", "128", "--temperature", "0", "--stats", "-q"]))
    venv = "venv (python -m runner)"
    rows = []
    for name in faces:
        s, d = statistics.median(start[name]), statistics.median(speed[name])
        rows.append([name, s, s / statistics.median(start[venv]), d, d / statistics.median(speed[venv])])
    print(f"\nexecutable {exe}: {Path(exe).stat().st_size / 1e6:.0f} MB; median of {args.repeats} interleaved runs\n")
    print_table(["face", "cold start to first token s", "vs venv", "decode tok/s", "vs venv"], rows)


if __name__ == "__main__":
    main()
