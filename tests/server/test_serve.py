"""`runner serve` as a process: shutdown with streams open, and where the API key comes from."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import threading
from pathlib import Path

import httpx
import pytest

from runner.core.errors import RunnerError
from runner.server.engine_thread import SHUTTING_DOWN
from runner.server.serve import API_KEY_ENV, api_key
from server_process import ServerProcess

COUNTING = "1, 2, 3, 4, 5, 6, 7,"  # greedy SmolLM2 keeps counting: replies that outlast the test


def key_args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"api_key": None, "api_key_file": None, **kw})


def test_the_api_key_comes_from_the_flag_the_file_or_the_environment(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert api_key(key_args()) is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert api_key(key_args()) == "from-env"
    keyfile = tmp_path / "key"
    keyfile.write_text("from-file\n")
    assert api_key(key_args(api_key_file=keyfile)) == "from-file"
    assert api_key(key_args(api_key="from-flag", api_key_file=keyfile)) == "from-flag"
    keyfile.write_text("\n")
    with pytest.raises(RunnerError, match="is empty"):
        api_key(key_args(api_key_file=keyfile))
    with pytest.raises(RunnerError, match="cannot read --api-key-file"):
        api_key(key_args(api_key_file=tmp_path / "missing"))


@pytest.mark.model
def test_sigterm_with_streams_open_cancels_them_and_exits_promptly(smollm2_path: Path, model_cache: Path) -> None:
    srv = ServerProcess("smollm2-135m-instruct", model_cache, "--parallel", "3", "--ctx-size", "4096")
    port = int(srv.url.rsplit(":", 1)[1])
    started = threading.Barrier(4)
    ends: list[str] = []

    def stream() -> None:
        body = {"model": srv.model, "prompt": COUNTING, "max_tokens": 4000, "ignore_eos": True, "temperature": 0,
                "stream": True}
        try:
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
                lines = r.iter_lines()
                next(lines)
                started.wait()
                last = ""
                for line in lines:
                    last = line or last
                ends.append(last)
        except httpx.HTTPError as exc:
            ends.append(type(exc).__name__)

    clients = [threading.Thread(target=stream) for _ in range(3)]
    for c in clients:
        c.start()
    try:
        started.wait(timeout=60)  # every stream has its first token: ~4000 tokens each still to come
        srv.proc.send_signal(signal.SIGTERM)
        exit_code = srv.proc.wait(timeout=20)  # not minutes of generation
    finally:
        srv.stop()
    for c in clients:
        c.join(timeout=30)
    assert exit_code in (0, -signal.SIGTERM)
    # each stream was ended with the reason, not cut, and not passed off as a whole reply ([DONE])
    ended = {"error": {"message": SHUTTING_DOWN, "type": "server_error", "param": None, "code": "shutting_down"}}
    assert ends == ["data: " + json.dumps(ended)] * 3
    with socket.socket() as s:  # the port is free again for a new server (which reuses TIME_WAIT addresses)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


@pytest.mark.model
def test_an_abandoned_whole_reply_stops_generating(smollm2_path: Path, model_cache: Path) -> None:
    srv = ServerProcess("smollm2-135m-instruct", model_cache, "--parallel", "1", "--ctx-size", "2048")
    try:
        body = {"model": srv.model, "prompt": COUNTING, "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up 1 s into the reply (connecting may take longer)
            httpx.post(srv.url + "/v1/completions", json=body, timeout=httpx.Timeout(1.0, connect=30.0))
        slots = srv.wait_all_idle(timeout_s=120)
        assert [s["state"] for s in slots] == ["idle"]
        metrics = srv.get("/metrics").text
        generated = int(next(ln.split()[1] for ln in metrics.splitlines()
                             if ln.startswith("runner_generated_tokens_total ")))
        assert 0 < generated < 1500  # cancelled, not run on to max_tokens (2000)
    finally:
        srv.stop()
