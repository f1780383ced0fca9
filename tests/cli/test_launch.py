"""`runner launch claude|codex`: the agent gets the environment and configuration that point it at
runner; a server is found on --port or started there (and stopped when the agent exits). The agent
here is a stand-in on PATH that records what it was given and asks the server for its models."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from server_process import ServerProcess, wait_for
from test_cli import assert_one_line_error, runner

# records argv and environment, then calls the server it was pointed at and exits 7
FAKE_AGENT = """#!{python}
import json, os, sys, urllib.request
base = os.environ.get("ANTHROPIC_BASE_URL") or next(a.split("=", 1)[1].strip('"') for a in sys.argv
                                                    if a.startswith("model_providers.runner.base_url=")).removesuffix("/v1")
key = os.environ.get("ANTHROPIC_AUTH_TOKEN") or os.environ.get("RUNNER_API_KEY")
def get(path):
    request = urllib.request.Request(base + path, headers={{"Authorization": "Bearer " + key}} if key else {{}})
    with urllib.request.urlopen(request) as reply:
        return json.loads(reply.read())
import glob, tempfile
models, slots = get("/v1/models"), get("/slots")
logs = glob.glob(os.path.join(tempfile.gettempdir(), "runner-launch-" + base.rsplit(":", 1)[1] + "-*.log"))
json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "models": models, "slots": slots,
           "log": open(logs[0]).read() if logs else None}}, open({record!r}, "w"))
sys.exit(7)
"""


def fake_agent(tmp_path: Path, name: str) -> tuple[dict[str, str], Path]:
    """PATH with a stand-in `name` first; the file it records to."""
    bin_dir, record = tmp_path / "bin", tmp_path / f"{name}.json"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(FAKE_AGENT.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, record


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_missing_agent_gets_one_line_saying_how_to_install_it(tmp_path: Path) -> None:
    proc = runner("launch", "codex", "--port", str(free_port()), env={"PATH": str(tmp_path)})
    assert_one_line_error(proc, r"codex is not installed \(not on PATH\): `npm install -g @openai/codex`")


@pytest.fixture(scope="module")
def tiny_server(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    server = ServerProcess(str(tiny_gguf), tmp_path_factory.mktemp("cache"), "--ctx-size", "256")
    yield server
    server.stop()


def _port(server: ServerProcess) -> str:
    return server.url.removesuffix("/v1").rsplit(":", 1)[1]


def test_claude_is_pointed_at_a_running_server_and_warned_of_its_small_context(tiny_server: ServerProcess,
                                                                               tmp_path: Path) -> None:
    env, record = fake_agent(tmp_path, "claude")
    proc = runner("launch", "claude", "--port", _port(tiny_server), "--", "-p", "hello", env=env)
    assert proc.returncode == 7, proc.stderr  # the agent's own exit status
    seen = json.loads(record.read_text())
    base = tiny_server.url.removesuffix("/v1")
    assert seen["argv"] == ["--model", "tiny", "-p", "hello"]
    assert {k: seen["env"][k] for k in ("ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                                        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "CLAUDE_CODE_AUTO_COMPACT_WINDOW",
                                        "CLAUDE_CODE_MAX_OUTPUT_TOKENS")} == {
        "ANTHROPIC_BASE_URL": base, "ANTHROPIC_MODEL": "tiny", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "tiny",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # (and the slot's window: it assumed 200,000 tokens)
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "256", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64"}
    assert [m["id"] for m in seen["models"]["data"]] == ["tiny"]
    assert "the server's slots hold 256 tokens" in proc.stderr and "--ctx-size 32768" in proc.stderr
    assert "already answers" not in proc.stderr
    flagged = runner("launch", "claude", "--port", _port(tiny_server), "--max-queue", "9", env=env)
    assert flagged.returncode == 7, flagged.stderr  # (the flags were dropped without a word)
    assert (f"runner: a server already answers on 127.0.0.1:{_port(tiny_server)}; --max-queue would apply only to "
            "one started here") in flagged.stderr


def test_codex_gets_a_responses_provider_and_a_started_server_is_stopped_after(tiny_gguf: Path,
                                                                               tmp_path: Path) -> None:
    env, record = fake_agent(tmp_path, "codex")
    port = free_port()
    proc = runner("launch", "codex", str(tiny_gguf), "--port", str(port), "--ctx-size", "512",
                  env={**env, "RUNNER_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 7, proc.stderr
    assert (f"no server on 127.0.0.1:{port}; starting `runner serve {tiny_gguf} --parallel 1 --ctx-size 512 "
            "--max-tokens 32768`") in proc.stderr  # (a reply Codex does not bound stopped at 1,024 tokens)
    seen = json.loads(record.read_text())
    assert seen["argv"] == ["-c", 'model_provider="runner"', "-c", 'model_providers.runner.name="runner"',
                            "-c", f'model_providers.runner.base_url="http://127.0.0.1:{port}/v1"',
                            "-c", 'model_providers.runner.wire_api="responses"', "-c", "model_context_window=512",
                            "-m", "tiny"]
    assert [m["id"] for m in seen["models"]["data"]] == ["tiny"]
    assert "the server's slots hold 512 tokens" in proc.stderr  # the context asked for, and too small for an agent
    assert '"GET /v1/models HTTP/1.1" 200' in seen["log"]  # (the server's log, a line per request, while it runs)
    assert not list(Path(tempfile.gettempdir()).glob(f"runner-launch-{port}-*.log"))  # (and gone after)
    with pytest.raises(OSError):  # the server it started is gone
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


def test_a_key_from_the_environment_reaches_the_agent_and_a_wrong_one_is_one_line(tiny_gguf: Path,
                                                                                 tmp_path: Path) -> None:
    """$RUNNER_API_KEY, as the README recommends: the server wants it, so the agent is given it (it was
    given 'runner', and saw only 401s)."""
    server = ServerProcess(str(tiny_gguf), tmp_path / "cache", "--ctx-size", "256", "--api-key", "s3cret")
    try:
        env, record = fake_agent(tmp_path, "claude")
        proc = runner("launch", "claude", "--port", _port(server), env={**env, "RUNNER_API_KEY": "s3cret"})
        assert proc.returncode == 7, proc.stderr
        seen = json.loads(record.read_text())
        # (as ANTHROPIC_API_KEY, Claude Code asked whether to use it, and its default answer logged it out)
        assert (seen["env"]["ANTHROPIC_AUTH_TOKEN"], seen["env"]["ANTHROPIC_API_KEY"]) == ("s3cret", "")
        assert [m["id"] for m in seen["models"]["data"]] == ["tiny"]
        wrong = runner("launch", "claude", "--port", _port(server), "--api-key", "nope", env=env)
        assert_one_line_error(wrong, "takes another API key than the one given")
        missing = runner("launch", "claude", "--port", _port(server), env={**env, "RUNNER_API_KEY": ""})
        assert_one_line_error(missing, "wants an API key: pass --api-key or set RUNNER_API_KEY")
    finally:
        server.stop()


def test_the_model_asked_for_is_used_where_a_server_of_several_serves_it(tiny_gguf: Path, tmp_path: Path) -> None:
    for name in ("first", "second"):
        (tmp_path / f"{name}.gguf").write_bytes(tiny_gguf.read_bytes())
    models = (str(tmp_path / "first.gguf"), str(tmp_path / "second.gguf"))
    server = ServerProcess("first", tmp_path / "cache", "--ctx-size", "256", "--no-preload", models=models)
    try:
        env, record = fake_agent(tmp_path, "claude")
        proc = runner("launch", "claude", "second", "--port", _port(server), env=env)
        assert proc.returncode == 7, proc.stderr
        assert json.loads(record.read_text())["argv"] == ["--model", "second"]  # (it was given the default, first)
    finally:
        server.stop()


def test_engine_flags_reach_a_server_started_here(tiny_gguf: Path, tmp_path: Path) -> None:
    """(launch took only --ctx-size for the server it starts: `--parallel 2` was 'unrecognized arguments')"""
    env, record = fake_agent(tmp_path, "codex")
    port = free_port()
    proc = runner("launch", "codex", str(tiny_gguf), "--port", str(port), "--ctx-size", "512", "--parallel", "2",
                  "--max-queue", "9", env={**env, "RUNNER_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 7, proc.stderr
    assert f"starting `runner serve {tiny_gguf} --parallel 2 --ctx-size 512 --max-tokens 32768 --max-queue 9`" in proc.stderr
    assert len(json.loads(record.read_text())["slots"]) == 2


def test_a_model_after_an_option_is_the_model_to_serve(tiny_gguf: Path, tmp_path: Path) -> None:
    """(argparse left `runner launch codex --port N MODEL`'s MODEL over: 'unrecognized arguments')"""
    env, record = fake_agent(tmp_path, "codex")
    port = free_port()
    proc = runner("launch", "codex", "--port", str(port), "--ctx-size", "512", str(tiny_gguf),
                  env={**env, "RUNNER_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 7, proc.stderr
    assert f"starting `runner serve {tiny_gguf} --parallel 1 --ctx-size 512 --max-tokens 32768`" in proc.stderr
    assert not list(Path(tempfile.gettempdir()).glob(f"runner-launch-{port}-*.log"))  # (it served: no log left)


# waits as an agent does, telling when it started and when a SIGTERM came
WAITING_AGENT = """#!{python}
import signal, sys, time
def terminated(signum, frame):
    open({record!r}, "a").write("terminated\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, terminated)
open({record!r}, "a").write("started\\n")
time.sleep(600)
"""


def _answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("how", [signal.SIGHUP, signal.SIGKILL])
def test_a_launch_killed_or_hung_up_stops_its_server(tiny_gguf: Path, tmp_path: Path, how: signal.Signals) -> None:
    """A closed terminal (SIGHUP) or a SIGKILL of launch left the server it started running for good."""
    bin_dir, record = tmp_path / "bin", tmp_path / "agent.log"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text(WAITING_AGENT.format(python=sys.executable, record=str(record)))
    (bin_dir / "claude").chmod(0o755)
    port = free_port()
    launch = subprocess.Popen([sys.executable, "-m", "runner", "launch", "claude", str(tiny_gguf), "--port", str(port),
                               "--ctx-size", "512"], stderr=subprocess.DEVNULL,
                              env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                   "RUNNER_CACHE_DIR": str(tmp_path / "cache")})
    try:
        assert wait_for(lambda: record.exists() and "started" in record.read_text(), 300), "the agent never started"
        assert _answers(port)
        launch.send_signal(how)
        launch.wait(timeout=60)
        assert wait_for(lambda: not _answers(port)), "the server outlived launch"
        if how == signal.SIGHUP:  # (launch's own stop: the agent is asked to end, not killed)
            assert wait_for(lambda: "terminated" in record.read_text())
    finally:
        launch.kill()
        subprocess.run(["pkill", "-f", str(bin_dir / "claude")], check=False)  # (a SIGKILLed launch's agent lives on)
