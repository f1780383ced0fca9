"""Images from the terminal: `runner run --image`, `runner chat --image` and the REPL's /image, on the
tiny model with a tiny projector (every image is 4 positions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from tiny_mmproj import png_bytes, write_tiny_mmproj

from runner.prompt.chat_template import image_mark
from runner.python_api.runner import Runner


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("images")
    (folder / "a.png").write_bytes(png_bytes(40, 30, seed=1))
    (folder / "b.png").write_bytes(png_bytes(40, 30, seed=2))
    (folder / "bad.png").write_bytes(b"not an image at all")
    return {"mmproj": write_tiny_mmproj(folder / "mmproj.gguf"), **{p.stem: p for p in folder.glob("*.png")}}


def run(model: Path, *args: str, stdin: str | None = None, command: str = "run") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", command, str(model), "--temperature", "0", "--max-tokens",
                           "8", "-q", *args], capture_output=True, text=True, input=stdin, timeout=120)


def test_run_with_an_image_replies_as_the_python_api_does_and_the_image_matters(tiny_gguf: Path,
                                                                                 files: dict[str, Path]) -> None:
    with_a = run(tiny_gguf, "--mmproj", str(files["mmproj"]), "--image", str(files["a"]), "-p", "what is this?")
    with_b = run(tiny_gguf, "--mmproj", str(files["mmproj"]), "--image", str(files["b"]), "-p", "what is this?")
    piped = run(tiny_gguf, "--mmproj", str(files["mmproj"]), "--image", str(files["a"]), stdin="what is this?",
                command="chat")
    assert with_a.returncode == with_b.returncode == piped.returncode == 0, with_a.stderr + with_b.stderr
    with Runner(tiny_gguf, mmproj=str(files["mmproj"]), ctx_size=256, log=lambda _: None) as api:
        expected = api.chat([{"role": "user", "content": image_mark(0) + "what is this?"}], [files["a"]],
                            max_tokens=8, temperature=0.0)
    assert with_a.stdout == piped.stdout == expected + "\n" and with_b.stdout != with_a.stdout


def test_image_errors_are_one_line(tiny_gguf: Path, files: dict[str, Path]) -> None:
    cases = {
        ("--image", str(files["a"])): "tiny takes no images: give it a vision projector (--mmproj FILE)",
        ("--mmproj", str(files["mmproj"]), "--image", str(files["bad"])):
            f"{files['bad']}: the image could not be decoded (png, jpeg, gif, bmp and webp are read)",
        ("--mmproj", str(files["mmproj"]), "--image", str(files["a"].with_name("missing.png"))):
            f"cannot read {files['a'].with_name('missing.png')}: No such file or directory",
        ("--image", str(files["a"]), "--raw"): "--image goes into a chat prompt: not with --raw or --beams",
    }
    for args, line in cases.items():
        done = run(tiny_gguf, *args, "-p", "hi")
        assert done.returncode == 1 and done.stderr.splitlines() == [f"runner: error: {line}"], (args, done.stderr)


def test_the_repl_attaches_an_image_to_the_next_message(tiny_gguf: Path, files: dict[str, Path]) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "runner", "chat", str(tiny_gguf), "--mmproj", str(files["mmproj"]),
                                           "--temperature", "0", "--max-tokens", "8", "-q"],
                          env={**os.environ, "TERM": "dumb"}, encoding="utf-8", timeout=120, dimensions=(50, 400))
    try:
        child.expect_exact(">>> ")
        child.sendline(f"/image {files['a'].with_name('missing.png')}")
        child.expect_exact("(no such file: ")
        child.expect_exact(">>> ")
        child.sendline(f"/image {files['a']}")
        child.expect_exact("(a.png goes with your next message)")
        child.expect_exact(">>> ")
        child.sendline("what is this?")
        child.expect(r"\[\d+ tokens")
        reply = child.before.split("what is this?", 1)[-1].strip()
        child.expect_exact(">>> ")
        child.sendline("/clear")  # the image goes with the conversation: the next one has none
        child.expect_exact("(conversation cleared)")
        child.expect_exact(">>> ")
        child.sendline("and now?")
        child.expect(r"\[\d+ tokens")
        assert "runner: error" not in child.before
        child.expect_exact(">>> ")
    finally:
        child.terminate(force=True)
    with Runner(tiny_gguf, mmproj=str(files["mmproj"]), ctx_size=256, log=lambda _: None) as api:
        expected = api.chat([{"role": "user", "content": image_mark(0) + "what is this?"}], [files["a"]],
                            max_tokens=8, temperature=0.0)
    assert reply == expected.strip()
