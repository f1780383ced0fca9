"""The coding agents' first requests, recorded from the real clients (agent_requests/*.json: Claude
Code 2.1 on the Messages API, Codex 0.171 on the Responses API): parsed into the one internal chat
request, refused on SmolLM2 only for their length, and answered in full on a model with the context
(gemma-3-270m cut to two layers: tests/shallow_gemma.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.server.anthropic_messages import parse_messages
from runner.server.openai_responses import parse_request
from runner.server.request_fields import IGNORED_TOOLS_HEADER, ignored_tools_header
from server_process import ServerProcess
from shallow_gemma import shallow_gemma

RECORDED = Path(__file__).parent / "agent_requests"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


def test_claude_codes_request_parses_with_its_system_messages_first_in_order() -> None:
    body = recorded("claude_code")["body"]
    params = parse_messages(body)
    assert [m.role for m in params.messages] == ["system", "user"]
    system = params.messages[0].content
    texts = [block["text"] for block in body["system"]] + [body["messages"][1]["content"]]  # the system message
    positions = [system.index(text) for text in texts]
    assert positions == sorted(positions) and positions[0] == 0
    assert [t.name for t in params.tools][:3] == ["Agent", "Bash", "CronCreate"] and len(params.tools) == 24
    assert (params.ignored_tools, params.show_thinking, params.common.stream) == ((), True, True)
    assert params.thinking_budget is None  # adaptive at effort high: as long as a reasoning model thinks
    assert params.common.max_tokens == 32000  # capped to the slot's room when it is scheduled


def test_codexs_request_parses_its_developer_messages_and_leaves_out_the_tools_it_cannot_run() -> None:
    body = recorded("codex")["body"]
    params = parse_request(body)
    developer = [part["text"] for item in body["input"] if item["role"] == "developer" for part in item["content"]]
    assert [m.role for m in params.messages] == ["system", "user", "user"]
    positions = [params.messages[0].content.index(text) for text in developer]
    assert positions == sorted(positions) and positions[0] == 0
    assert [t.name for t in params.tools] == ["exec_command", "write_stdin", "request_user_input", "view_image",
                                             "get_goal", "create_goal", "update_goal"]
    assert params.ignored_tools == ("multi_agent_v1", "web_search")
    assert (params.tool_choice, params.parallel_tool_calls, params.common.stream) == ("auto", True, True)


def test_the_header_naming_left_out_tools_is_latin_1_whatever_their_names() -> None:
    assert ignored_tools_header(()) == {}
    assert ignored_tools_header(("web_search", "\u0100 x")) == {IGNORED_TOOLS_HEADER: "web_search, %C4%80%20x"}
    long = ignored_tools_header(("t" * 60,) * 100)[IGNORED_TOOLS_HEADER]
    assert len(long) <= 4096 and long.endswith(", ...") and set(long.removesuffix(", ...").split(", ")) == {"t" * 60}


def _post(server: ServerProcess, name: str, **changes: Any) -> httpx.Response:
    request = recorded(name)
    body = {**request["body"], "model": server.model, **changes}
    headers = {k: v for k, v in request["headers"].items() if k.lower() != "content-length"}
    return httpx.post(server.url.removesuffix("/v1") + request["path"], json=body, headers=headers, timeout=600)


@pytest.mark.model
@pytest.mark.parametrize("name", ["claude_code", "codex"])
def test_on_smollm2_the_only_refusal_is_the_prompt_length(serve_smollm2: Callable[..., ServerProcess],
                                                          name: str) -> None:
    server = serve_smollm2("--parallel", "2", "--ctx-size", "2048")
    reply = _post(server, name)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    found = re.search(r"the prompt has (\d+) tokens but a slot's context holds (\d+)", message)
    assert found, message
    n_prompt, n_ctx = int(found[1]), int(found[2])
    assert n_prompt > 4096 and n_ctx == 2048  # past the default slot context (4096) too


def _events(reply: httpx.Response) -> list[tuple[str | None, dict[str, Any]]]:
    """The SSE stream as (event name, data) pairs, in order."""
    out, name = [], None
    for line in reply.text.splitlines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and line != "data: [DONE]":
            out.append((name, json.loads(line.removeprefix("data: "))))
            name = None
    return out


@pytest.fixture(scope="module")
def gemma(model_cache: Path, gemma_path: Path) -> Iterator[ServerProcess]:
    """gemma-3-270m's tokenizer, template and 32k context, cut to two layers (a 20k-token prompt
    in seconds), with a 32k slot: the context an agent's prompt needs."""
    shallow = shallow_gemma(gemma_path, model_cache)
    server = ServerProcess("gemma-3-270m", model_cache, "--alias", "gemma-3-270m", "--ctx-size", "32768",
                           "--parallel", "1", models=(str(shallow),))
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.model
def test_claude_codes_first_request_gets_a_whole_messages_stream(gemma: ServerProcess) -> None:
    reply = _post(gemma, "claude_code", max_tokens=12, temperature=0)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = _events(reply)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] > 10000 and start["model"] == "gemma-3-270m"
    assert events[-2][1]["usage"]["output_tokens"] >= 1
    assert events[-2][1]["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")


@pytest.mark.slow
@pytest.mark.model
def test_codexs_first_request_gets_a_whole_responses_stream(gemma: ServerProcess) -> None:
    reply = _post(gemma, "codex", max_output_tokens=12, temperature=0)
    assert reply.status_code == 200, reply.text
    assert reply.headers[IGNORED_TOOLS_HEADER] == "multi_agent_v1, web_search"
    events = _events(reply)
    kinds = [data["type"] for _, data in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1][1]["response"]
    assert final["usage"]["input_tokens"] > 4096 and final["output"]
    assert [n for n, _ in events] == kinds  # every event is named for its type
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
