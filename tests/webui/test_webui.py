"""The built-in chat page in a real Chromium (driven by playwright) against `runner serve`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from server_process import ServerProcess

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
LONG = "Count from 1 to 300, separated by commas."
REPO = Path(__file__).resolve().parents[2]


def set_settings(page, **values: object) -> None:
    if page.locator("#settings").is_hidden():
        page.click("#settings-toggle")
    for key, value in values.items():
        page.fill(f"#{key}", str(value))
        page.dispatch_event(f"#{key}", "change")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def reply_text(page) -> str:
    return page.locator(".message.assistant .body").last.inner_text()


def wait_for_reply_longer_than(page, n_chars: int, timeout_s: float = 60) -> None:
    """Polled from here: page.wait_for_function compiles its predicate in the page, which the page's
    Content-Security-Policy (no eval) rightly refuses."""
    deadline = time.monotonic() + timeout_s
    while len(page.evaluate("document.querySelector('.message.assistant .body')?.innerText || ''")) <= n_chars:
        assert time.monotonic() < deadline, f"the reply did not pass {n_chars} characters"
        page.wait_for_timeout(20)


def test_reply_streams_then_shows_stats(page) -> None:
    set_settings(page, temperature=0, max_tokens=150)
    send(page, LONG)
    wait_for_reply_longer_than(page, 10)
    first = len(reply_text(page))
    assert page.locator(".message.assistant .stats").count() == 0  # still streaming
    wait_for_reply_longer_than(page, first + 20)
    page.wait_for_selector(".message.assistant .stats", timeout=60000)
    stats = page.inner_text(".message.assistant .stats")
    assert stats.startswith("150 tokens · ") and "tok/s · first token " in stats


def test_stop_ends_the_reply_and_frees_the_slot(page, server: ServerProcess) -> None:
    set_settings(page, temperature=0, max_tokens=1500)
    send(page, LONG)
    wait_for_reply_longer_than(page, 30)
    page.click("#stop")
    page.wait_for_selector(".message.assistant .stats")
    assert page.inner_text(".message.assistant .stats").endswith("· stopped")
    stopped_at = reply_text(page)
    assert [s["state"] for s in server.wait_all_idle(timeout_s=60)] == ["idle"] * 4  # a deadline, not a speed
    time.sleep(0.5)  # (a loaded machine can only make this pass more easily, never fail it)
    assert reply_text(page) == stopped_at


def test_reload_keeps_the_conversation(page) -> None:
    set_settings(page, temperature=0, max_tokens=8)
    send(page, "Say hi.")
    page.wait_for_selector(".message.assistant .stats")
    before = page.locator(".message").all_inner_texts()
    page.reload()
    page.wait_for_selector(".message.assistant .stats")
    assert page.locator(".message").all_inner_texts() == before
    assert page.locator("#conversations li.active .name").inner_text() == "Say hi."


def test_settings_shape_the_request(page) -> None:
    set_settings(page, system="Be brief.", temperature=0.3, top_p=0.5, max_tokens=7, seed=42)
    with page.expect_request("**/v1/chat/completions") as req:
        send(page, "Hello there")
    body = json.loads(req.value.post_data)
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.3, 0.5, 7, 42)
    assert body["model"] == MODEL and body["stream"] is True
    page.wait_for_selector(".message.assistant .stats")


def test_greedy_in_the_page_equals_the_api(page, server: ServerProcess) -> None:
    set_settings(page, temperature=0, max_tokens=24)
    send(page, "What is 2 + 2?")
    page.wait_for_selector(".message.assistant .stats")
    api = server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                                                    "temperature": 0, "max_tokens": 24}).json()
    assert reply_text(page) == api["choices"][0]["message"]["content"].strip()
    if os.environ.get("RUNNER_UPDATE_SCREENSHOT"):  # the README shows it; a plain test run leaves the checkout alone
        page.screenshot(path=str(REPO / "docs" / "ui.png"))


def test_model_output_cannot_inject_html(page, tmp_path: Path) -> None:
    evil = ('<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> and **bold**\n'
            "```html\n<b>not bold</b>\n```")
    convo = [{"title": "evil", "messages": [{"role": "user", "content": "<i>hi</i>"},
                                            {"role": "assistant", "content": evil}]}]
    path = tmp_path / "convo.json"
    path.write_text(json.dumps(convo))
    page.set_input_files("#import", str(path))
    page.wait_for_selector(".message.assistant")
    assert page.evaluate("window.__pwned") is None
    assert page.locator(".message img, .message script, .message i, .message b").count() == 0
    text = reply_text(page)
    assert "<script>window.__pwned = 1</script>" in text and "<b>not bold</b>" in text
    assert page.locator(".message.assistant strong").inner_text() == "bold"
    assert page.locator(".message.assistant .code-block .copy").count() == 1


def test_two_pages_stream_at_once(browser, server: ServerProcess) -> None:
    pages = []
    for _ in range(2):
        ctx = browser.new_context()
        pg = ctx.new_page()
        pg.goto(server.url + "/")
        set_settings(pg, temperature=0, max_tokens=400)
        pages.append(pg)
    for pg in pages:
        send(pg, LONG)
    deadline = time.time() + 60  # a deadline for a slow machine, not a speed the test needs
    busy = 0
    while time.time() < deadline and busy < 2:
        busy = sum(s["state"] == "generating" for s in server.get("/slots").json())
        time.sleep(0.05)
    assert busy >= 2
    lengths = [len(reply_text(pg)) for pg in pages]
    deadline = time.time() + 60
    while not all(len(reply_text(pg)) > n for pg, n in zip(pages, lengths)):  # both still growing
        assert time.time() < deadline, "a reply stopped growing while both were generating"
        time.sleep(0.05)
    for pg in pages:
        pg.click("#stop")
        pg.context.close()


def test_api_key_is_asked_once_and_errors_show_as_messages(browser, smollm2_path: Path, model_cache: Path) -> None:
    srv = ServerProcess(MODEL, model_cache, "--parallel", "1", "--api-key", "s3cret", "--ctx-size", "512")
    try:
        ctx = browser.new_context()
        pg = ctx.new_page()
        answers = iter(["wrong", "s3cret"])
        pg.on("dialog", lambda d: d.accept(next(answers)))
        pg.goto(srv.url + "/")
        set_settings(pg, temperature=0, max_tokens=4)
        send(pg, "Hi")  # 401 with the wrong key: asked again, then it works
        pg.wait_for_selector(".message.assistant .stats", timeout=30000)
        assert pg.evaluate("localStorage.getItem('runner.apiKey')") == "s3cret"
        srv.stop()
        send(pg, "Hi again")
        pg.wait_for_selector(".message.assistant.error")
        assert "unreachable" in pg.locator(".message.assistant.error").inner_text()
        ctx.close()
    finally:
        srv.stop()


def test_error_envelope_text_is_shown(page, server: ServerProcess) -> None:
    set_settings(page, max_tokens=4)
    page.evaluate("localStorage.setItem('runner.conversations', JSON.stringify([{id: 'x', title: 't', "
                  "settings: {model: 'no-such-model', max_tokens: 4}, messages: []}])); "
                  "localStorage.setItem('runner.current', 'x')")
    page.reload()
    send(page, "Hi")
    page.wait_for_selector(".message.assistant.error")
    assert "404: The model 'no-such-model' does not exist" in page.locator(".message.error").inner_text()


def wait_until(page, expression: str, timeout_s: float = 60) -> None:
    """Polled from here, as wait_for_reply_longer_than is (the page's CSP refuses wait_for_function)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true in {timeout_s} s: {expression}"
        page.wait_for_timeout(50)


@pytest.fixture(scope="module")
def router(smollm2_path: Path, gemma_path: Path, model_cache: Path):
    server = ServerProcess(MODEL, model_cache, "--parallel", "1", "--ctx-size", "1024",
                           models=(MODEL, "gemma-3-270m"))
    yield server
    server.stop()


def test_the_model_picker_shows_states_and_switches_the_next_reply(browser, router: ServerProcess) -> None:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    try:
        page.goto(router.url + "/")
        wait_until(page, "document.querySelectorAll('#model option').length === 2")
        assert page.locator("#model option").all_inner_texts() == [MODEL, "gemma-3-270m (unloaded)"]
        set_settings(page, temperature=0, max_tokens=8)
        send(page, "Say hi.")
        page.wait_for_selector(".message.assistant .stats")
        page.select_option("#model", "gemma-3-270m")
        with page.expect_request("**/v1/chat/completions") as req:
            send(page, "And again.")
        page.locator(".message.assistant .stats").nth(1).wait_for(timeout=120000)
        body = json.loads(req.value.post_data)
        assert body["model"] == "gemma-3-270m" and [m["role"] for m in body["messages"]] == [
            "user", "assistant", "user"]  # the conversation goes on, on the other model
        loaded = {m["id"]: m["status"]["value"] for m in router.get("/models").json()["data"]}
        assert loaded == {MODEL: "loaded", "gemma-3-270m": "loaded"}
        metrics = router.get("/metrics").text
        assert 'runner_requests_total{model="gemma-3-270m"} 1' in metrics
        wait_until(page, "document.querySelectorAll('#model option')[1].textContent === 'gemma-3-270m'")
    finally:
        context.close()


def test_a_reply_stopped_while_its_model_loads_leaves_its_question_unsent(browser, router: ServerProcess) -> None:
    """Stopped while its model loads, before any text: the question was sent again with the next one (two
    user turns in a row)."""
    router.post("/models/unload", json={"model": "gemma-3-270m"})
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    try:
        page.goto(router.url + "/")
        wait_until(page, "document.querySelectorAll('#model option').length === 2")
        page.select_option("#model", "gemma-3-270m")
        set_settings(page, temperature=0, max_tokens=4)
        send(page, "Say hi.")
        deadline = time.monotonic() + 60
        while model_states(router)["gemma-3-270m"] != "loading":
            assert time.monotonic() < deadline, "gemma never started loading"
            time.sleep(0.02)
        page.click("#stop")
        page.wait_for_selector(".message.assistant .stats")
        assert page.locator(".message.user.unsent").all_inner_texts() == ["Say hi."]
        with page.expect_request("**/v1/chat/completions") as req:
            send(page, "And again.")
        assert [m["role"] for m in json.loads(req.value.post_data)["messages"]] == ["user"]
        page.locator(".message.assistant .stats").nth(1).wait_for(timeout=120000)
        assert page.locator(".message.error").count() == 0
    finally:
        context.close()


def model_states(router: ServerProcess) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in router.get("/models").json()["data"]}


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory, model_cache: Path):
    from tiny_gguf import write_tiny_gguf
    from tiny_mmproj import write_tiny_mmproj

    folder = tmp_path_factory.mktemp("vision")
    model, projector = write_tiny_gguf(folder / "tiny.gguf"), write_tiny_mmproj(folder / "mmproj.gguf")
    server = ServerProcess(str(model), model_cache, "--mmproj", str(projector), "--ctx-size", "256")
    yield server
    server.stop()


def wait_for_model_list(page) -> None:
    deadline = time.monotonic() + 30
    while not page.evaluate("Object.keys(state.inputs).length"):
        assert time.monotonic() < deadline, "the page never listed the models"
        page.wait_for_timeout(20)


def test_an_attached_image_is_sent_as_a_data_uri_shown_and_answered(browser, vision_server: ServerProcess,
                                                                     tmp_path: Path) -> None:
    import base64

    from tiny_mmproj import png_bytes

    png = tmp_path / "cat.png"
    png.write_bytes(png_bytes(40, 30, seed=1))
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    try:
        page.goto(vision_server.url + "/")
        wait_for_model_list(page)
        set_settings(page, temperature=0, max_tokens=6)
        page.set_input_files("#attach", str(png))
        page.wait_for_selector("#attachments img")
        with page.expect_request("**/v1/chat/completions") as req:
            send(page, "what is this?")
        page.wait_for_selector(".message.assistant .stats")
        parts = json.loads(req.value.post_data)["messages"][-1]["content"]
        uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
        assert parts == [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": uri}}]
        assert page.locator(".message.user .images img").count() == 1 and page.locator("#attachments").is_hidden()
        assert page.locator(".message.error").count() == 0
        shown = page.evaluate("current().messages[1].content")  # the reply as streamed (before markdown)
    finally:
        context.close()
    api = vision_server.post("/v1/chat/completions", json={"model": "tiny", "temperature": 0, "max_tokens": 6,
                                                           "messages": [{"role": "user", "content": parts}]}).json()
    assert shown == api["choices"][0]["message"]["content"]


def test_a_text_only_model_refuses_an_image_with_a_readable_message(page, tmp_path: Path) -> None:
    from tiny_mmproj import png_bytes

    png = tmp_path / "cat.png"
    png.write_bytes(png_bytes(40, 30, seed=1))
    wait_for_model_list(page)
    page.set_input_files("#attach", str(png))
    notice = page.wait_for_selector("#attachments .notice")
    assert notice.inner_text() == f"{MODEL} takes no images: choose a vision model, or start it with --mmproj"
    assert page.locator("#attachments img").count() == 0


def test_a_refused_message_is_shown_but_not_sent_again(page) -> None:
    """A message the server refused (here: longer than a slot) stayed in the history and was sent with
    every later one, so the conversation could only fail from then on."""
    set_settings(page, temperature=0, max_tokens=4)
    send(page, "word " * 3000)
    page.wait_for_selector(".message.assistant.error")
    assert "context" in page.locator(".message.assistant.error").inner_text()
    assert page.locator(".message.user.unsent").count() == 1
    with page.expect_request("**/v1/chat/completions") as req:
        send(page, "Hi")
    assert json.loads(req.value.post_data)["messages"] == [{"role": "user", "content": "Hi"}]
    page.wait_for_selector(".message.assistant .stats")


def test_a_reply_the_page_was_closed_during_is_said_so_and_its_question_not_sent_again(page) -> None:
    set_settings(page, temperature=0, max_tokens=1500)
    send(page, LONG)
    wait_for_reply_longer_than(page, 30)
    page.reload()  # (the stored reply was empty: the next request sent two user turns in a row)
    page.wait_for_selector(".message.assistant.error")
    assert page.locator(".message.assistant.error").inner_text().endswith("the page was closed before this reply ended")
    with page.expect_request("**/v1/chat/completions") as req:
        send(page, "Hi")
    assert json.loads(req.value.post_data)["messages"] == [{"role": "user", "content": "Hi"}]
    page.wait_for_selector(".message.assistant .stats")


def hold_requests(page) -> list:
    """Chat requests the page sends wait here, unanswered (as behind a slow network or a model's load)."""
    held: list = []
    page.route("**/v1/chat/completions", lambda route: held.append(route))
    return held


# Gemma 3's check that roles alternate (the gemma GGUF the tests pull carries a template without it)
ALTERNATING_TEMPLATE = (
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<start_of_turn>{{ message['role'] }}\n{{ message['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def alternating_server(tmp_path_factory: pytest.TempPathFactory, model_cache: Path):
    from tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path_factory.mktemp("alternating") / "alternating.gguf",
                            chat_template=ALTERNATING_TEMPLATE)
    server = ServerProcess(str(model), model_cache, "--ctx-size", "512")
    yield server
    server.stop()


def test_a_reply_stopped_before_its_first_token_leaves_its_question_unsent(browser, alternating_server) -> None:
    """The empty stopped reply was skipped but its question sent on: two user turns in a row, which a
    template that needs alternating roles refused with a 400, for every later message."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    try:
        page.goto(alternating_server.url + "/")
        set_settings(page, temperature=0, max_tokens=4)
        send(page, "Say hi.")
        page.wait_for_selector(".message.assistant .stats")
        held = hold_requests(page)
        send(page, "And again.")
        while not held:
            page.wait_for_timeout(20)
        page.click("#stop")
        page.locator(".message.assistant .stats").nth(1).wait_for()
        assert page.locator(".message.assistant .stats").nth(1).inner_text() == (
            "0 tokens · n/a tok/s · first token n/a · stopped")
        assert page.locator(".message.user.unsent").all_inner_texts() == ["And again."]
        page.unroute("**/v1/chat/completions")
        with page.expect_request("**/v1/chat/completions") as req:
            send(page, "Third.")
        assert [m["role"] for m in json.loads(req.value.post_data)["messages"]] == ["user", "assistant", "user"]
        page.locator(".message.assistant .stats").nth(2).wait_for()  # (not a 400: "roles must alternate")
        assert page.locator(".message.error").count() == 0
    finally:
        context.close()


def send_refused_megabytes(page, n_chars: int) -> None:
    """A message of n_chars, far longer than a slot: the server refuses it (set in the page: filling the
    textarea that long through playwright is slow)."""
    n_before = page.locator(".message.assistant.error").count()
    page.evaluate(f"document.getElementById('input').value = 'lorem ipsum '.repeat({n_chars // 12})")
    page.press("#input", "Enter")
    page.locator(".message.assistant.error").nth(n_before).wait_for()


def test_a_full_storage_is_said_and_new_conversations_are_still_kept(page) -> None:
    """Past the quota save() dropped images, then stored nothing more, silently: a refused 3 MB message
    stayed stored, and every conversation after it was gone on reload."""
    set_settings(page, temperature=0, max_tokens=4)
    send_refused_megabytes(page, 3_000_000)
    assert page.locator("#attachments").is_hidden()  # (3 MB fits Chromium's 5 M characters)
    send_refused_megabytes(page, 3_000_000)
    assert page.wait_for_selector("#attachments .notice").inner_text() == (
        "The browser's storage is full: a reload will lose the full text of unsent messages (Export keeps everything)")
    page.click("#new-chat")
    send(page, "Say hi.")
    page.wait_for_selector(".message.assistant .stats")
    page.reload()
    assert page.locator("#conversations .name").all_inner_texts() == ["Say hi.", "lorem ipsum " * 3 + "lore"]
    assert page.locator(".message").first.inner_text() == "Say hi."
    stored = page.evaluate("JSON.parse(localStorage.getItem('runner.conversations'))[1].messages")
    assert [(m["role"], m.get("unsent"), len(m["content"])) for m in stored if m["role"] == "user"] == [
        ("user", True, 201)] * 2  # the unsent messages cut to their first 200 characters and "…"


def test_a_full_storage_drops_unsent_text_then_images_then_the_oldest_conversations(page) -> None:
    """The forms save() tries in turn when all does not fit, and what its notice says each loses."""
    tried = page.evaluate("""() => {
        state.currentId = 'open';
        const convos = [{ id: 'new', messages: [{ role: 'user', content: 'look', images: ['data:,'] }] },
                         { id: 'open', messages: [{ role: 'user', content: 'x'.repeat(300), unsent: true }] },
                         { id: 'old', messages: [] }, { id: 'oldest', messages: [] }];
        return [...storable(convos)].map(([lost, kept]) => [lost, kept.map((c) => c.id),
                                                            kept[0].messages[0]?.images?.length || 0]);
    }""")
    unsent, everyone = "the full text of unsent messages", ["new", "open", "old", "oldest"]
    assert tried == [["", everyone, 1], [unsent, everyone, 1], [f"{unsent} and images", everyone, 0],
                     [f"{unsent}, images and the oldest conversation", ["new", "open", "old"], 0],
                     [f"{unsent}, images and the 2 oldest conversations", ["new", "open"], 0],
                     [f"{unsent}, images and the 3 oldest conversations", ["open"], 0]]


def test_two_tabs_keep_each_others_conversations(browser, server: ServerProcess) -> None:
    context = browser.new_context()  # (one browser profile: one localStorage for both tabs)
    tabs = [context.new_page() for _ in range(2)]
    for tab in tabs:
        tab.goto(server.url + "/")
    for tab, text in zip(tabs, ["Say A.", "Say B."]):
        if text == "Say B.":
            tab.click("#new-chat")  # (the tabs share the current conversation until one starts another)
        set_settings(tab, temperature=0, max_tokens=4)
        send(tab, text)
        tab.wait_for_selector(".message.assistant .stats")
    tabs[0].reload()  # (tab B's save wrote the conversations it had read at load: A's was lost)
    names = tabs[0].locator("#conversations .name").all_inner_texts()
    assert "Say A." in names and "Say B." in names
    context.close()


def test_enter_while_an_input_method_composes_does_not_send_and_other_files_are_named(page, tmp_path: Path) -> None:
    page.fill("#input", "ni")
    page.dispatch_event("#input", "keydown", {"key": "Enter", "isComposing": True})
    page.wait_for_timeout(200)
    assert page.locator(".message").count() == 0 and page.input_value("#input") == "ni"
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    page.set_input_files("#attach", str(notes))
    assert page.wait_for_selector("#attachments .notice").inner_text() == "only images can be attached here"
