"""OpenAI's Chat Completions and Completions replies (whole and streamed), built from the engine's
StreamEvents: one builder per kind of reply, and ChoicesBuilder for a request's n choices."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from runner.prompt.tools import ShownText, ToolReading
from runner.scheduler.request import FinishReason, StreamEvent, TokenLogprob, Usage
from runner.server.reasoning import ReasoningSplitter
from runner.server.replies import TokenText, piece_of, read_reply, rest_after, sse


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        # extensions: speculative decoding's drafted tokens verified, and kept
        "draft_tokens_proposed": usage.draft_proposed,
        "draft_tokens_accepted": usage.draft_accepted,
    }


def finish_reason_json(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    return "length" if reason is FinishReason.LENGTH else "stop"


def _chat_logprob(lp: TokenLogprob, token_bytes: TokenText) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes(token_id)
        return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}

    return {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, p) for t, p in lp.top]}


@dataclass
class CompletionLogprobs:
    """The legacy /v1/completions logprobs shape, accumulated token by token."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    _offset: int = 0

    def add_unscored(self, token_id: int, token_bytes: TokenText) -> None:
        """A token nothing predicted (the first of an echoed prompt): its logprob is null."""
        text = token_bytes(token_id).decode("utf-8", "replace")
        self.tokens.append(text)
        self.token_logprobs.append(None)
        self.top_logprobs.append(None)
        self.text_offset.append(self._offset)
        self._offset += len(text)

    def add(self, lp: TokenLogprob, token_bytes: TokenText) -> None:
        text = token_bytes(lp.token_id).decode("utf-8", "replace")
        self.tokens.append(text)
        self.token_logprobs.append(lp.logprob)
        top = {token_bytes(t).decode("utf-8", "replace"): p for t, p in lp.top}
        top.setdefault(text, lp.logprob)  # the chosen token is always among them (OpenAI's: up to logprobs + 1)
        self.top_logprobs.append(top)
        self.text_offset.append(self._offset)
        self._offset += len(text)

    def json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


class OpenAIReplyBuilder:
    """What a chat reply and a completion share: the envelope, the text so far, the end of the
    stream. `chunk_sse` writes the usual chunk (text only, the stream goes on) from a per-request
    template: building and encoding the whole envelope was a fifth of the event loop's CPU per
    streamed token."""

    OBJECT = ""  # the whole reply's "object"
    CHUNK_OBJECT = ""  # ... and a streamed chunk's
    TEXT_KEY = ""  # how a chunk's choice opens its text

    def __init__(self, request_id: str, model: str, token_bytes: TokenText, wants_logprobs: bool,
                 index: int = 0) -> None:
        self.index = index  # which of the request's n choices this builds
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.token_bytes = token_bytes
        self.wants_logprobs = wants_logprobs
        self.text_parts: list[str] = []
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None
        head = json.dumps({**self.envelope([], chunk=True), "choices": None}, ensure_ascii=False)
        self._text_head = 'data: ' + head.removesuffix("null}") + '[{"index": ' + str(index) + ', ' + self.TEXT_KEY
        self._text_tail = ', "logprobs": null, "finish_reason": null'
        self._held_drafted: list[bool] = []  # flags of tokens whose events sent no chunk (yet)

    def envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": self.CHUNK_OBJECT if chunk else self.OBJECT,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def add(self, event: StreamEvent) -> None:
        self.text_parts.append(event.text)
        if self.wants_logprobs:
            self._add_logprobs(event)
        if event.is_final:
            self.finish_reason, self.usage = event.finish_reason, event.usage

    def _add_logprobs(self, event: StreamEvent) -> None:
        raise NotImplementedError

    def chunk(self, event: StreamEvent) -> dict[str, Any] | None:
        """The chunk for one event (None when it carries nothing to send)."""
        raise NotImplementedError

    def _is_plain_text(self, event: StreamEvent) -> bool:
        """Whether the event's chunk is the template's: text only, the stream goes on."""
        return not self.wants_logprobs and event.finish_reason is None and bool(event.text)

    def _drafted(self, event: StreamEvent) -> list[bool]:
        """The drafted flags a chunk carries: those of tokens held back before it (a piece of a UTF-8
        character has no text to send; a tag may be arriving), then its own event's."""
        flags, self._held_drafted = self._held_drafted + list(event.drafted), []
        return flags

    def _hold_drafted(self, event: StreamEvent) -> None:
        self._held_drafted += event.drafted

    def chunk_sse(self, event: StreamEvent) -> str | None:
        """`sse(chunk(event))`, written from the template for the usual chunk."""
        if not self._is_plain_text(event):
            chunk = self.chunk(event)
            return None if chunk is None else sse(chunk)
        self.add(event)
        flags = self._drafted(event)
        drafted = f', "drafted": {json.dumps(flags)}' if flags else ""
        return self._text_head + json.dumps(event.text, ensure_ascii=False) + self._text_tail + drafted + "}]}\n\n"

    # -- the stream's frame (server/streaming.py asks every dialect's builder the same) ---------
    def first_chunk(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def stream_start(self) -> str:
        first = self.first_chunk()
        return sse(first) if first is not None else ""

    def stream_error(self, message: str, code: str = "generation_failed") -> str:
        """The event that ends a failed stream (no [DONE] after it)."""
        return sse({"error": {"message": message, "type": "server_error", "param": None, "code": code}})

    def stream_end(self, include_usage: bool) -> str:
        usage = sse(self.usage_chunk()) if include_usage and self.usage is not None else ""
        return usage + sse("[DONE]")

    def usage_chunk(self) -> dict[str, Any]:
        assert self.usage is not None
        return {**self.envelope([], chunk=True), "usage": usage_json(self.usage)}

    def whole_choice(self) -> dict[str, Any]:
        raise NotImplementedError

    def whole(self) -> dict[str, Any]:
        assert self.usage is not None
        return {**self.envelope([self.whole_choice()], chunk=False), "usage": usage_json(self.usage)}


class ChatReplyBuilder(OpenAIReplyBuilder):
    """One chat completion: deltas of content (and reasoning), tool calls read from the whole reply."""

    OBJECT = "chat.completion"
    CHUNK_OBJECT = "chat.completion.chunk"
    TEXT_KEY = '"delta": {"content": '

    def __init__(self, request_id: str, model: str, token_bytes: TokenText, wants_logprobs: bool,
                 reasoning: ReasoningSplitter | None = None, tools: ToolReading | None = None,
                 index: int = 0) -> None:
        super().__init__(request_id, model, token_bytes, wants_logprobs, index)
        self._text_tail = "}" + self._text_tail
        self.tools = tools  # the reply is read for calls once whole (streamed: its text up to where one may begin)
        self.shown = ShownText(tools.syntax) if tools is not None else None
        self.reasoning = reasoning  # split <think>…</think> into reasoning_content (None: text stays inline)
        self.logprobs: list[dict[str, Any]] = []

    def _add_logprobs(self, event: StreamEvent) -> None:
        self.logprobs.extend(_chat_logprob(lp, self.token_bytes) for lp in event.logprobs)

    def first_chunk(self) -> dict[str, Any]:
        # (with tools the reply may be only calls, whose content is null, as the whole reply's is)
        delta = {"role": "assistant", "content": "" if self.tools is None else None}
        return self.envelope([{"index": self.index, "delta": delta, "logprobs": None, "finish_reason": None}],
                             chunk=True)

    def chunk(self, event: StreamEvent) -> dict[str, Any] | None:
        n_before = len(self.logprobs)
        self.add(event)
        reason = finish_reason_json(event.finish_reason)
        if not event.text and reason is None and not event.logprobs:
            self._hold_drafted(event)
            return None
        logprobs = {"content": self.logprobs[n_before:]} if self.wants_logprobs else None
        delta = self._delta(event, reason)
        if not delta and reason is None and not event.logprobs:
            self._hold_drafted(event)
            return None  # all of it held back (a tag may be arriving)
        choice = {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        drafted = self._drafted(event)
        if drafted:  # extension: per token, accepted from a draft or not
            choice["drafted"] = drafted
        return self.envelope([choice], chunk=True)

    def _delta(self, event: StreamEvent, reason: str | None) -> dict[str, str]:
        if self.reasoning is None:
            return {"content": event.text} if event.text or reason is None else {}
        reasoning, content = piece_of(event, self.reasoning, None)
        delta = {"reasoning_content": reasoning} if reasoning else {}
        if content:
            delta["content"] = content
        return delta

    def _is_plain_text(self, event: StreamEvent) -> bool:
        return super()._is_plain_text(event) and (self.reasoning is None or self.reasoning.is_plain)

    def chunk_sse(self, event: StreamEvent) -> str | None:
        if self.tools is not None:
            return self._tool_chunks_sse(event)
        return super().chunk_sse(event)

    def _tool_chunks_sse(self, event: StreamEvent) -> str | None:
        """With tools, the text streams up to where a call may begin; when the reply ends, the rest
        of it, then the calls (the first fragment of each with its id, type and name, the next with
        its arguments)."""
        assert self.shown is not None
        n_before = len(self.logprobs)
        self.add(event)
        # (the tokens' logprobs go out as they come, the text they spell maybe later: as the whole reply's)
        logprobs = {"content": self.logprobs[n_before:]} if self.wants_logprobs and event.logprobs else None
        reasoning, text = piece_of(event, self.reasoning, self.shown)
        delta = {"reasoning_content": reasoning} if reasoning else {}
        if not event.is_final:
            if text:
                delta["content"] = text
            if not delta and logprobs is None:
                self._hold_drafted(event)
                return None
            choice = {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
            drafted = self._drafted(event)
            if drafted:
                choice["drafted"] = drafted
            return sse(self.envelope([choice], chunk=True))
        reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)
        text += rest_after(reply.content, self.shown.shown)
        if text:
            delta["content"] = text
        deltas: list[dict[str, Any]] = [delta] if delta else []
        reason = finish_reason_json(self.finish_reason)
        if reply.calls:
            reason = "tool_calls" if reason == "stop" else reason
            for i, call in enumerate(reply.calls):
                deltas.append({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]})
        chunks = [self.envelope([{"index": self.index, "delta": d, "logprobs": None, "finish_reason": None}], chunk=True)
                  for d in deltas]
        last = {"index": self.index, "delta": {}, "logprobs": logprobs, "finish_reason": reason}
        drafted = self._drafted(event)
        if drafted:  # (the final event's tokens', and those of any held before it)
            last["drafted"] = drafted
        chunks.append(self.envelope([last], chunk=True))
        return "".join(sse(c) for c in chunks)

    def whole_choice(self) -> dict[str, Any]:
        reason = finish_reason_json(self.finish_reason)
        logprobs = {"content": self.logprobs} if self.wants_logprobs else None
        reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content,
                                   "refusal": None}  # OpenAI's spec: required, nullable
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.calls:
            message["content"] = reply.content or None
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]
            reason = "tool_calls" if reason == "stop" else reason
        return {"index": self.index, "message": message, "logprobs": logprobs, "finish_reason": reason}


class CompletionReplyBuilder(OpenAIReplyBuilder):
    """One text completion (/v1/completions), the prompt echoed before it when asked."""

    OBJECT = CHUNK_OBJECT = "text_completion"
    TEXT_KEY = '"text": '

    def __init__(self, request_id: str, model: str, token_bytes: TokenText, wants_logprobs: bool,
                 index: int = 0, echo: tuple[str, tuple[int, ...]] | None = None,
                 prompt_token_bytes: TokenText | None = None) -> None:
        """`prompt_token_bytes`: an echoed prompt's tokens as its text spells them (its control
        tokens too: ModelFacts.prompt_token_bytes), so their offsets are the text's."""
        super().__init__(request_id, model, token_bytes, wants_logprobs, index)
        self.logprobs = CompletionLogprobs()
        self.echo = echo  # the prompt's text and ids, returned before the completion
        self.prompt_token_bytes = prompt_token_bytes or token_bytes
        if echo is not None:
            self.text_parts.append(echo[0])
            if wants_logprobs and echo[1]:
                self.logprobs.add_unscored(echo[1][0], self.prompt_token_bytes)

    def _add_logprobs(self, event: StreamEvent) -> None:
        for lp in event.prompt_logprobs:
            self.logprobs.add(lp, self.prompt_token_bytes)
        for lp in event.logprobs:
            self.logprobs.add(lp, self.token_bytes)

    def first_chunk(self) -> dict[str, Any] | None:
        if self.echo is None:
            return None
        choice = {"index": self.index, "text": self.echo[0], "logprobs": None, "finish_reason": None}
        return self.envelope([choice], chunk=True)

    def chunk(self, event: StreamEvent) -> dict[str, Any] | None:
        n_before = len(self.logprobs.tokens)
        self.add(event)
        reason = finish_reason_json(event.finish_reason)
        if not event.text and reason is None and not event.logprobs:
            self._hold_drafted(event)
            return None
        lp = self.logprobs
        logprobs = (
            CompletionLogprobs(lp.tokens[n_before:], lp.token_logprobs[n_before:], lp.top_logprobs[n_before:],
                               lp.text_offset[n_before:]).json()
            if self.wants_logprobs else None
        )
        choice = {"index": self.index, "text": event.text, "logprobs": logprobs, "finish_reason": reason}
        drafted = self._drafted(event)
        if drafted:
            choice["drafted"] = drafted
        return self.envelope([choice], chunk=True)

    def whole_choice(self) -> dict[str, Any]:
        logprobs = self.logprobs.json() if self.wants_logprobs else None
        return {"index": self.index, "text": "".join(self.text_parts), "logprobs": logprobs,
                "finish_reason": finish_reason_json(self.finish_reason)}


class ChoicesBuilder:
    """A request's choices (each its own reply builder, fed by its own engine request) as one
    response: chunks keep their choice's index. The builders come in groups of group_size, one
    group per prompt (a completion may send several): usage counts each prompt once and every
    choice's tokens; with best_of above n, each group's n with the highest mean token logprob are
    returned, numbered on across the groups."""

    def __init__(self, builders: list[OpenAIReplyBuilder], request_ids: list[str], n_return: int,
                 group_size: int | None = None) -> None:
        self.builders = builders
        self.by_id = {rid: b for rid, b in zip(request_ids, builders, strict=True)}
        self.n_return = n_return
        self.group_size = group_size or len(builders)
        self.sum_logprob = {id(b): 0.0 for b in builders}
        self.n_tokens = {id(b): 0 for b in builders}

    def add(self, event: StreamEvent) -> None:
        builder = self.by_id[event.request_id]
        for lp in event.logprobs:
            self.sum_logprob[id(builder)] += lp.logprob
            self.n_tokens[id(builder)] += 1
        builder.add(event)

    def _groups(self) -> list[list[OpenAIReplyBuilder]]:
        size = self.group_size
        return [self.builders[i:i + size] for i in range(0, len(self.builders), size)]

    def _usage(self) -> Usage:
        firsts = [group[0].usage for group in self._groups()]
        usages = [b.usage for b in self.builders if b.usage is not None]
        return Usage(sum(u.prompt_tokens for u in firsts if u is not None), sum(u.completion_tokens for u in usages),
                     sum(u.cached_tokens for u in firsts if u is not None),
                     sum(u.draft_proposed for u in usages), sum(u.draft_accepted for u in usages))

    def mean_logprob(self, builder: OpenAIReplyBuilder) -> float:
        n = self.n_tokens[id(builder)]
        return self.sum_logprob[id(builder)] / n if n else float("-inf")

    def whole(self) -> dict[str, Any]:
        chosen = []
        for group in self._groups():
            if self.n_return < len(group):  # best_of: the best n, best first
                group = sorted(group, key=self.mean_logprob, reverse=True)[: self.n_return]
            chosen.extend(group)
        choices = []
        for index, builder in enumerate(chosen):
            builder.index = index
            choices.append(builder.whole_choice())
        return {**self.builders[0].envelope(choices, chunk=False), "usage": usage_json(self._usage())}

    def stream_start(self) -> str:
        return "".join(b.stream_start() for b in self.builders)

    def chunk_sse(self, event: StreamEvent) -> str | None:
        return self.by_id[event.request_id].chunk_sse(event)

    def stream_error(self, message: str, code: str = "generation_failed") -> str:
        return self.builders[0].stream_error(message, code)

    def stream_end(self, include_usage: bool) -> str:
        first = self.builders[0]
        first.usage = self._usage()
        return first.stream_end(include_usage)
