"""SmolLM2 split between this machine and loopback `runner rpc-worker`s: the same replies as run
locally (alone, in parallel slots, with n-gram speculation), and a worker killed mid-stream takes
down only its model's process, which the next request loads again once the worker is back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rpc_workers import Worker
from server_process import ServerProcess

pytestmark = pytest.mark.model
SMOL = "smollm2-135m-instruct"
SPLIT = "smol-split"  # SmolLM2, a third of its layers here and the rest on a worker
PROMPT = "List three facts about the Moon."


@pytest.fixture(scope="module")
def workers(smollm2_path: Path) -> Iterator[list[Worker]]:
    started = [Worker(), Worker()]
    yield started
    for worker in started:
        worker.kill()


def run(model_cache: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "runner", "run", SMOL, "-p", PROMPT, "--max-tokens", "32",
                           "--temperature", "0", "-q", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "RUNNER_CACHE_DIR": str(model_cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_split_here_and_on_workers_replies_as_locally(model_cache: Path, workers: list[Worker]) -> None:
    local = run(model_cache)
    assert len(local.split()) > 10
    assert run(model_cache, "--rpc", workers[0].address, "--tensor-split", "1,2") == local
    assert run(model_cache, "--rpc", f"{workers[0].address},{workers[1].address}") == local


@pytest.fixture(scope="module")
def router(model_cache: Path, workers: list[Worker], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = tmp_path_factory.mktemp("rpc") / "models.toml"
    config.write_text(f'[models."{SPLIT}"]\nmodel = "{SMOL}"\nrpc = "{workers[1].address}"\ntensor_split = "1,2"\n'
                      'draft = "ngram"\nspec = "on"\n')
    server = ServerProcess(SMOL, model_cache, "--parallel", "2", "--ctx-size", "1024", "--keep-alive", "10m",
                           "--models-config", str(config), models=(SMOL,))
    yield server
    server.stop()


def chat(server: ServerProcess, model: str, content: str, max_tokens: int = 24) -> httpx.Response:
    return server.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0})


def test_parallel_slots_and_ngram_drafts_on_a_split_model_reply_as_locally(router: ServerProcess) -> None:
    prompts = ["Count from one to twenty in words.", "Repeat after me: the cat sat on the mat, the cat sat on the mat."]
    local = [chat(router, SMOL, p, 40).json() for p in prompts]
    split: list[dict] = [{}, {}]
    threads = [threading.Thread(target=lambda i=i: split.__setitem__(i, chat(router, SPLIT, prompts[i], 40).json()))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for here, there in zip(local, split):
        assert there["choices"][0]["message"]["content"] == here["choices"][0]["message"]["content"]
    assert sum(r["usage"]["draft_tokens_proposed"] for r in split) > 0  # drafts were verified on the workers


def stream_events(server: ServerProcess, on_first: threading.Event, out: list[str]) -> None:
    body = {"model": SPLIT, "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 600,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append(line.removeprefix("data: "))
                on_first.set()


def test_a_worker_killed_mid_stream_fails_only_its_model_until_it_is_back(router: ServerProcess,
                                                                          workers: list[Worker]) -> None:
    first, events = threading.Event(), []
    streaming = threading.Thread(target=stream_events, args=(router, first, events))
    streaming.start()
    assert first.wait(120)
    workers[1].kill()
    streaming.join(120)
    error = json.loads(events[-1])["error"]
    assert error["code"] == "model_process_failed" and "[DONE]" not in events
    health = router.get("/health").json()
    assert health["models"][SPLIT] == "failed" and "Remote RPC server crashed" in health["failed"][SPLIT]
    assert chat(router, SMOL, "Hi", 2).status_code == 200  # the server and its other model are up
    down = chat(router, SPLIT, "Hi", 2)
    assert down.status_code == 503 and down.json()["error"]["code"] == "model_unavailable"
    assert f"cannot reach RPC worker {workers[1].address}" in down.json()["error"]["message"]
    workers[1].start()  # back, on the same port
    again = chat(router, SPLIT, "Hi", 2)
    assert again.status_code == 200 and router.get("/health").json()["failed"] == {}
