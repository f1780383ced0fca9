"""The internal request types every dialect's parser builds (with keywords), whatever API it speaks:
the chat pipeline and the stream writer read these, never a dialect's JSON."""

from __future__ import annotations

from dataclasses import dataclass

from runner.prompt.chat_template import Message
from runner.prompt.tools import Tool
from runner.sampling.constraints import GrammarSpec
from runner.sampling.params import SamplingParams
from runner.scheduler.request import BeamParams
from runner.server.images import ImageInput


@dataclass(frozen=True)
class CommonParams:
    model: str | None
    sampling: SamplingParams
    max_tokens: int | None = None  # None: the server's default (--max-tokens), capped by the slot's room
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    n_top_logprobs: int | None = None
    ignore_eos: bool = False  # extension (as llama.cpp's server): generate max_tokens even past end-of-text
    grammar: GrammarSpec | None = None  # response_format / grammar / json_schema: what the reply must follow
    n: int = 1  # choices: generations of the one prompt (the server caps it at its slot count)
    beam: BeamParams | None = None  # use_beam_search: the n choices are the n best beams


@dataclass(frozen=True)
class ChatParams:
    common: CommonParams
    messages: list[Message]
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"  # "auto", "none", "required", or the name of the function to call
    parallel_tool_calls: bool = True
    ignored_tools: tuple[str, ...] = ()  # tools of kinds this server cannot run, left out of the prompt
    show_thinking: bool = False  # Messages: a reasoning model's thinking comes back as thinking blocks
    thinking_budget: int | None = None  # most tokens a reasoning model thinks (None: as long as it does)
    images: tuple[ImageInput, ...] = ()  # in the order of their IMAGE_MARKs in the messages' contents


@dataclass(frozen=True)
class CompletionParams:
    common: CommonParams
    prompts: tuple[str | tuple[int, ...], ...]  # each a text or token ids; several: a batch answered together
    best_of: int = 1  # generate this many choices, return the n with the highest mean token logprob
    echo: bool = False  # the prompt comes back before the completion (with logprobs: scored)
    suffix: str | None = None  # the text after the completion: each prompt is the text before it (prompt/infill.py)


@dataclass(frozen=True)
class EmbeddingParams:
    model: str | None
    inputs: list[str] | list[list[int]]  # texts, or token id lists
    encoding_format: str
    dimensions: int | None
