"""The one-file executable: built with PyInstaller, run from elsewhere with an empty environment."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fake_hub import FakeHub, FakeRepo
from tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.slow, pytest.mark.model]


@pytest.fixture(scope="module")
def exe(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "runner"
    proc = subprocess.run([sys.executable, "-m", "runner", "bundle", str(smollm2_path), "-o", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert [p.name for p in out.parent.iterdir()] == ["runner"]  # (PyInstaller's work folder, a model's copy, is gone)
    return out


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "TMPDIR": str(home), **extra}


def run_exe(exe: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["env", "-i", *[f"{k}={v}" for k, v in clean_env(home, **env).items()], str(exe), *args],
                          capture_output=True, text=True, cwd=home, timeout=120)


def test_version_and_run_on_the_embedded_model(exe: Path, home: Path) -> None:
    assert run_exe(exe, home, "--version").stdout.strip() == "runner 0.1.0"
    assert "bundle" not in run_exe(exe, home, "--help").stdout  # (it needs PyInstaller and a Python)
    proc = run_exe(exe, home, "run", "-p", "Hello", "--max-tokens", "8", "--temperature", "0", "-q")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip()) > 0
    assert not list(home.glob("_MEI*"))
    listed = run_exe(exe, home, "list").stdout.splitlines()  # (it said "no models cached", carrying one)
    assert listed[0].startswith("SmolLM2-135M-Instruct.Q4_1.gguf (") and listed[0].endswith("MB): carried by this executable")
    assert listed[1].startswith("no other models cached in ")


def test_the_executable_pulls_and_runs_a_hub_model(exe: Path, home: Path, tmp_path: Path) -> None:
    commit = "1" * 40
    hub = FakeHub({"org/tiny-GGUF": FakeRepo({commit: {"tiny-Q8_0.gguf": write_tiny_gguf(tmp_path / "t.gguf").read_bytes()}},
                                             {"main": commit})})
    url = hub.start()
    try:
        proc = run_exe(exe, home, "run", "hf.co/org/tiny-GGUF", "-p", "the", "--max-tokens", "3", "--temperature", "0",
                       "-q", HF_ENDPOINT=url)
    finally:
        hub.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (home / ".cache" / "runner" / "models" / "hf" / "org" / "tiny-GGUF" / commit / "tiny-Q8_0.gguf").exists()


def start(exe: Path, home: Path, *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([str(exe), *args], env=clean_env(home, RUNNER_NO_BROWSER="1"), cwd=home,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    deadline, lines = time.time() + 60, []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break  # it exited
        lines.append(line)
        match = re.search(r"(http://127\.0\.0\.1:(\d+))", line)
        if match:
            return proc, match.group(1)
    proc.kill()
    proc.wait()
    proc.stderr.close()  # (left open, its warning failed whichever test the collector ran in)
    raise AssertionError("the executable did not start serving: " + "".join(lines)[-2000:])


@pytest.mark.parametrize(("args", "sig"), [((), signal.SIGINT), (("serve", "--port", "0"), signal.SIGTERM)])
def test_serves_the_chat_and_stops_cleanly(exe: Path, home: Path, args: tuple[str, ...], sig: signal.Signals) -> None:
    proc, url = start(exe, home, *args)  # no arguments: what a double-click does
    try:
        models = httpx.get(url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["smollm2-135m-instruct"]
        chat = httpx.post(url + "/v1/chat/completions", timeout=60,
                          json={"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}],
                                "max_tokens": 4})
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] >= 1
        structured = httpx.post(url + "/v1/chat/completions", timeout=60, json={  # llguidance travels in the exe
            "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40,
            "temperature": 0,
            "response_format": {"type": "json_object"}})
        assert structured.status_code == 200, structured.text
        assert isinstance(json.loads(structured.json()["choices"][0]["message"]["content"]), dict)
        page = httpx.get(url + "/", timeout=10)
        assert page.status_code == 200 and "/webui/app.js" in page.text
        assert httpx.get(url + "/webui/app.js", timeout=10).status_code == 200
        assert list(home.glob("_MEI*"))  # unpacked while running
        started = time.time()
        proc.send_signal(sig)
        proc.wait(timeout=15)
        assert time.time() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the port is free again
    assert not list(home.glob("_MEI*"))  # the bootloader removed its temp dir


def test_the_page_loads_in_chromium(exe: Path, home: Path) -> None:
    from browser import launched_chromium

    proc, url = start(exe, home)
    try:
        with launched_chromium() as browser:
            page = browser.new_page()
            failed: list[str] = []
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.goto(url + "/")
            page.wait_for_selector("#server-status:has-text('slots busy')")
            assert page.title() == "runner · smollm2-135m-instruct"
            assert failed == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        proc.stderr.close()
