"""Images in prompts through the server: a tiny text model with a tiny LLaVA-style projector
(tests/tiny_mmproj.py: every image is 4 positions), each dialect's image part, encode-once (the
slot's KV, then the cache of encoded images), two slots side by side, and every bad input's 400."""

from __future__ import annotations

import base64
import json
import io
import resource
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines import in_process_server, load_tiny
from runner.server.images import MAX_IMAGES
from tiny_mmproj import N_IMAGE_TOKENS, png_bytes, write_tiny_mmproj

PNG = png_bytes(40, 30, seed=1)
OTHER_PNG = png_bytes(40, 30, seed=2)


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_message(text: str, data: bytes = PNG) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": data_uri(data)}}]}


def chat(client: Any, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0,
                                                  **extra})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf")


@pytest.fixture
def vision(tiny_gguf: Path, mmproj: Path) -> Iterator[tuple[Any, Any]]:
    loaded = load_tiny(tiny_gguf, 2, mmproj=str(mmproj))
    with in_process_server(loaded) as client:
        yield client, loaded


def test_an_image_is_spanned_between_text_and_changes_the_greedy_reply(vision: tuple[Any, Any]) -> None:
    client, loaded = vision
    ids, spans = loaded.chat_prompt(*_one_image_prompt(loaded))
    (span,) = spans
    assert span.n_tokens == N_IMAGE_TOKENS and 0 < span.start and span.end < len(ids)  # text on both sides
    assert all(t < 0 for t in ids[span.start:span.end]) and all(t >= 0 for t in ids[:span.start] + ids[span.end:])
    with_image = chat(client, [image_message("what is this?")])
    again = chat(client, [image_message("what is this?")])
    without = chat(client, [{"role": "user", "content": "what is this?"}])
    reply = with_image["choices"][0]["message"]["content"]
    assert again["choices"][0]["message"]["content"] == reply
    assert without["choices"][0]["message"]["content"] != reply
    assert with_image["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"] + N_IMAGE_TOKENS
    assert client.get("/v1/models").json()["data"][0]["inputs"] == ["text", "image"]


def _one_image_prompt(loaded: Any) -> tuple[list, None, list]:
    from runner.prompt.chat_template import Message, image_mark

    return [Message("user", f"what is {image_mark(0)} this?")], None, [loaded.media_chunks(PNG)]


def test_the_next_turn_reuses_the_images_kv_and_an_evicted_image_is_not_encoded_again(
        vision: tuple[Any, Any]) -> None:
    client, loaded = vision
    images = loaded.runner.images
    first = chat(client, [image_message("describe it")])
    assert images.n_encodes == 1
    turn_two = [image_message("describe it"), first["choices"][0]["message"],
                {"role": "user", "content": "and its colour?"}]
    second = chat(client, turn_two)
    assert images.n_encodes == 1  # the image's KV was reused: nothing encoded, nothing decoded
    n_first_prompt = first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_first_prompt - 1
    for seed in range(4):  # other prompts take both slots: the image's KV is gone
        chat(client, [{"role": "user", "content": f"unrelated question number {seed} " * 3}])
    hits = images.cache.n_hits
    third = chat(client, [image_message("describe it")])
    assert images.n_encodes == 1 and images.cache.n_hits == hits + 1  # decoded from the kept embeddings
    assert third["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    chat(client, [image_message("describe it", OTHER_PNG)])
    assert images.n_encodes == 2  # another image is encoded


def test_an_image_is_encoded_on_the_requests_thread_and_the_engine_only_decodes_it(tiny_gguf: Path,
                                                                                   mmproj: Path) -> None:
    from engines import submit_all, token_ids
    from runner.runtime.media_cache import MediaCache
    from runner.scheduler.request import GenerationRequest
    from runner.sampling.params import SamplingParams

    loaded = load_tiny(tiny_gguf, 1, mmproj=str(mmproj))
    try:
        images = loaded.runner.images
        messages, tools, chunks = _one_image_prompt(loaded)  # media_chunks: what the pipeline calls off the engine
        ((chunk,),) = chunks
        assert images.n_encodes == 1 and chunk.embeddings is not None
        assert chunk.embeddings.shape == (chunk.n_tokens, images.projector.n_embd)
        images.cache = MediaCache(images.cache.max_bytes)  # not there: an engine that ignored them would encode
        ids, spans = loaded.chat_prompt(messages, tools, chunks)
        events = submit_all(loaded.engine, [GenerationRequest("i", ids, SamplingParams(temperature=0.0),
                                                              max_tokens=4, ignore_eos=True, media=spans)])
    finally:
        loaded.close()
    assert len(token_ids(events[0])) == 4 and images.n_encodes == 1


def test_a_text_stream_beside_an_image_request_gets_its_tokens_alone(tiny_gguf: Path, mmproj: Path) -> None:
    from engines import submit_all, token_ids
    from runner.scheduler.request import GenerationRequest
    from runner.sampling.params import SamplingParams

    loaded = load_tiny(tiny_gguf, 2, mmproj=str(mmproj))
    try:
        greedy = SamplingParams(temperature=0.0)
        ids, spans = loaded.chat_prompt(*_one_image_prompt(loaded))
        text_ids = loaded.chat_prompt_ids(_text_messages())
        alone = submit_all(loaded.engine, [GenerationRequest("t", text_ids, greedy, max_tokens=12, ignore_eos=True)])
        image_alone = submit_all(loaded.engine, [GenerationRequest("i", ids, greedy, max_tokens=12, ignore_eos=True,
                                                                   media=spans)])
        loaded.runner.context.kv_clear()
        for slot in loaded.engine.scheduler.pool.slots:
            slot.truncate(0)
        both = submit_all(loaded.engine, [GenerationRequest("i2", ids, greedy, max_tokens=12, ignore_eos=True,
                                                            media=spans),
                                          GenerationRequest("t2", text_ids, greedy, max_tokens=12, ignore_eos=True)])
    finally:
        loaded.close()
    assert token_ids(both[1]) == token_ids(alone[0]) and len(token_ids(alone[0])) == 12
    assert token_ids(both[0]) == token_ids(image_alone[0])


def _text_messages() -> list:
    from runner.prompt.chat_template import Message

    return [Message("user", "a question with no image at all")]


# -- bad input, in each dialect's envelope ---------------------------------------------------------------
def bomb_png(width: int = 50_000, height: int = 50_000) -> bytes:
    """A PNG of a few hundred bytes that declares width x height pixels (its one row of data is short)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 4096))
            + chunk(b"IEND", b""))


BROKEN_PNG = PNG[:40] + b"\0" * 64  # a PNG's header, then nothing an image decoder can read


def openai(client: Any, parts: list[dict[str, Any]]) -> Any:
    return client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": parts}],
                                                     "max_tokens": 4})


def anthropic(client: Any, blocks: list[dict[str, Any]]) -> Any:
    return client.post("/v1/messages", json={"model": "tiny", "messages": [{"role": "user", "content": blocks}], "max_tokens": 4})


def responses(client: Any, parts: list[dict[str, Any]]) -> Any:
    return client.post("/v1/responses", json={"model": "tiny", "input": [{"role": "user", "content": parts}],
                                              "max_output_tokens": 4})


def image_parts(dialect: str, images: list[bytes]) -> list[dict[str, Any]]:
    text = {"openai": {"type": "text", "text": "look"}, "anthropic": {"type": "text", "text": "look"},
            "responses": {"type": "input_text", "text": "look"}}[dialect]
    def part(data: bytes) -> dict[str, Any]:
        if dialect == "openai":
            return {"type": "image_url", "image_url": {"url": data_uri(data)}}
        if dialect == "anthropic":
            return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                "data": base64.b64encode(data).decode()}}
        return {"type": "input_image", "image_url": data_uri(data)}
    return [text] + [part(d) for d in images]


SEND = {"openai": openai, "anthropic": anthropic, "responses": responses}
WHERE = {"openai": "messages[0].content[1]", "anthropic": "messages.0.content.1", "responses": "input[0].content[1]"}


def error_of(dialect: str, r: Any) -> tuple[str, str | None]:
    """(message, code or type) from the dialect's envelope."""
    body = r.json()
    if dialect == "anthropic":
        assert body["type"] == "error"
        return body["error"]["message"], body["error"]["type"]
    return body["error"]["message"], body["error"]["code"]


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_bad_images_are_400s_naming_the_part(vision: tuple[Any, Any], dialect: str) -> None:
    client, _ = vision
    send, where = SEND[dialect], WHERE[dialect]
    cases = {
        "not an image": (b"plain text, not an image", "not an image this server reads"),
        "undecodable": (BROKEN_PNG, "could not be decoded"),
        "bomb": (bomb_png(), "declares 50000 x 50000 pixels"),
        "no pixels": (bomb_png(0, 0), "declares 0 x 0 pixels: it has none"),
    }
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for name, (data, words) in cases.items():
        r = send(client, image_parts(dialect, [data]))
        assert r.status_code == 400, (name, r.text)
        message, _ = error_of(dialect, r)
        assert words in message and where in message, (name, message)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200_000  # KiB: nothing decoded the bomb
    r = send(client, image_parts(dialect, [PNG] * (MAX_IMAGES + 1)))
    assert r.status_code == 400 and f"at most {MAX_IMAGES} images" in error_of(dialect, r)[0]
    # and the server still answers an image request afterwards (no slot was left stuck)
    assert send(client, image_parts(dialect, [PNG])).status_code == 200


def webp_of(png: bytes) -> bytes:
    """The PNG's pixels as a lossless WebP (Pillow writes it)."""
    from PIL import Image

    out = io.BytesIO()
    with Image.open(io.BytesIO(png)) as image:
        image.save(out, format="WEBP", lossless=True)
    return out.getvalue()


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_a_webp_image_reads_as_the_same_pixels_in_png(vision: tuple[Any, Any], dialect: str) -> None:
    """libmtmd reads WebP only through an ffmpeg it launches: runner decodes it itself."""
    client, _ = vision
    route, text_of = {
        "openai": ("/v1/chat/completions", lambda body: body["choices"][0]["message"]["content"]),
        "anthropic": ("/v1/messages", lambda body: body["content"][0]["text"]),
        "responses": ("/v1/responses", lambda body: body["output"][0]["content"][0]["text"]),
    }[dialect]

    def greedy(data: bytes) -> str:
        messages = [{"role": "user", "content": image_parts(dialect, [data])}]
        r = client.post(route, json={"model": "tiny", "temperature": 0, "max_tokens": 8, "max_output_tokens": 8,
                                     ("input" if dialect == "responses" else "messages"): messages})
        assert r.status_code == 200, r.text
        return text_of(r.json())

    webp = webp_of(PNG)
    assert webp[8:12] == b"WEBP"
    assert greedy(webp) == greedy(PNG) != greedy(webp_of(OTHER_PNG))
    r = SEND[dialect](client, image_parts(dialect, [webp[:40] + bytes(len(webp) - 40)]))  # (its header, then zeros)
    assert r.status_code == 400 and "could not be decoded" in error_of(dialect, r)[0], r.text


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_an_image_to_a_text_only_model_is_a_400(tiny_gguf: Path, dialect: str) -> None:
    with in_process_server(load_tiny(tiny_gguf, 1)) as client:
        r = SEND[dialect](client, image_parts(dialect, [PNG]))
        assert r.status_code == 400
        message, _ = error_of(dialect, r)
        assert "this model takes no images" in message and WHERE[dialect] in message
        assert client.get("/v1/models").json()["data"][0]["inputs"] == ["text"]


def test_an_image_url_is_not_fetched_and_an_image_too_long_for_the_slot_says_its_tokens(
        tiny_gguf: Path, mmproj: Path) -> None:
    with in_process_server(load_tiny(tiny_gguf, 1, mmproj=str(mmproj), ctx_size=48, batch_size=32)) as client:
        r = openai(client, [{"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}}])
        assert r.status_code == 400 and r.json()["error"]["code"] == "remote_media_off"
        r = openai(client, image_parts("openai", [PNG] * 12))
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["message"] == (f"the request's 12 image(s) and clip(s) take {12 * N_IMAGE_TOKENS} "
                                                "positions; a slot's context holds 48")  # (refused before encoding)
        r = openai(client, image_parts("openai", [PNG] * 11))  # (fewer, but too many beside the text)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert f"({11 * N_IMAGE_TOKENS} of them for its 11 image(s))" in r.json()["error"]["message"]


def test_ollama_takes_images_on_chat_and_generate(vision: tuple[Any, Any]) -> None:
    client, _ = vision
    image = base64.b64encode(PNG).decode()
    openai_reply = chat(client, [image_message("what is this?")])["choices"][0]["message"]["content"]
    r = client.post("/api/chat", json={"model": "tiny", "stream": False, "options": {"temperature": 0, "num_predict": 8},
                                       "messages": [{"role": "user", "content": "what is this?", "images": [image]}]})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == openai_reply  # the same prompt: text, then the image
    r = client.post("/api/generate", json={"model": "tiny", "stream": False, "prompt": "what is this?",
                                           "images": [image], "options": {"temperature": 0, "num_predict": 8}})
    assert r.status_code == 200 and r.json()["response"] == openai_reply
    r = client.post("/api/chat", json={"model": "tiny", "stream": False,
                                       "messages": [{"role": "user", "content": "hi", "images": ["not base64!"]}]})
    assert r.status_code == 400 and "messages.0.images.0" in r.json()["error"]


@pytest.fixture
def image_site() -> Iterator[str]:
    """A web server with a PNG, a 404, a file that declares 30 MB and a redirect to a file: URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Site(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/cat.png":
                self.send_response(200)
                self.send_header("Content-Length", str(len(PNG)))
                self.end_headers()
                self.wfile.write(PNG)
            elif self.path == "/big.png":
                self.send_response(200)
                self.send_header("Content-Length", str(30 * 10**6))
                self.end_headers()
            elif self.path == "/garbage":  # not HTTP at all (an image_url pointing at, say, an SSH port)
                self.wfile.write(b"SSH-2.0-OpenSSH_9.2\r\n")
                self.close_connection = True
            elif self.path == "/away":
                self.send_response(302)
                self.send_header("Location", "file:///etc/passwd")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_error(404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def chat_raw(client: Any, messages: list[dict[str, Any]]) -> Any:
    return client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 8,
                                                     "temperature": 0})


def test_with_allow_remote_media_an_image_url_is_fetched_bounded(tiny_gguf: Path, mmproj: Path,
                                                                  image_site: str) -> None:
    loaded = load_tiny(tiny_gguf, 1, mmproj=str(mmproj))
    with in_process_server(loaded, allow_remote_media=True) as client:
        def greedy(url: str) -> Any:
            return chat_raw(client, [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                                  {"type": "image_url", "image_url": {"url": url}}]}])

        fetched, inline = greedy(f"{image_site}/cat.png"), greedy(data_uri(PNG))
        assert fetched.status_code == inline.status_code == 200, fetched.text
        assert fetched.json()["choices"][0]["message"]["content"] == inline.json()["choices"][0]["message"]["content"]
        codes = {}
        for path in ("/missing.png", "/big.png", "/away", "/garbage"):
            r = openai(client, [{"type": "image_url", "image_url": {"url": image_site + path}}])
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]"
            codes[path] = (r.json()["error"]["code"], r.json()["error"]["message"])
    assert codes["/missing.png"][0] == "image_fetch_failed" and "Not Found" in codes["/missing.png"][1]
    assert codes["/big.png"][0] == "image_too_large" and "larger than 20 MB" in codes["/big.png"][1]
    assert codes["/garbage"][0] == "image_fetch_failed"
    assert codes["/away"][0] == "image_fetch_failed" and "'file:///etc/passwd' is not allowed" in codes["/away"][1]


def test_an_image_in_an_anthropic_tool_result_reaches_the_model(vision: tuple[Any, Any]) -> None:
    """Claude Code's Read tool on a screenshot: the tool_result holds text and an image block (it was
    a 400: 'must be a string or a list of text blocks')."""
    client, loaded = vision

    def result(image: bytes) -> dict[str, Any]:
        return {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "the screenshot:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(image).decode()}}]}

    def ask(image: bytes) -> dict[str, Any]:
        messages = [{"role": "user", "content": "look at the screen"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read",
                                                       "input": {"path": "screen.png"}}]},
                    {"role": "user", "content": [result(image)]}]
        r = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "temperature": 0, "messages": messages})
        assert r.status_code == 200, r.text
        return r.json()

    with_image, with_other = ask(PNG), ask(OTHER_PNG)
    n_prompt = [r["usage"]["input_tokens"] + r["usage"]["cache_read_input_tokens"] for r in (with_image, with_other)]
    assert n_prompt[0] == n_prompt[1] > N_IMAGE_TOKENS
    assert loaded.runner.images.n_encodes == 2  # (each image's pixels reached the model)
    bad = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}]}]})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == ('messages.0.content.0.content.0: a tool result holds text and image '
                                              'blocks, not "document"')
