"""From a dialect's parsed parameters to the engine's GenerationRequests: the template and
tokenizer, the prompt-fits check, the reply's grammar (response format, tools, reasoning), the
choices and their seeds. Chat requests take this one path whichever API asked (Chat Completions,
Responses, Messages); text completions share its parts."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import numpy as np

from starlette.concurrency import run_in_threadpool

from runner.core.errors import InputError
from runner.model.model_facts import TokenIdError
from runner.model.request_builder import (
    choice_requests,
    generation_request,
    new_request_id,
    reply_length,
)
from runner.prompt.chat_template import TemplateError, TemplateLimitError
from runner.prompt.tools import TRIGGERS, ToolReading, call_grammar
from runner.runtime.embeddings import InputTooLongError
from runner.sampling.constraints import (
    JSON_KINDS,
    JSON_LAYOUT,
    AnyConstraint,
    Constraint,
    ConstraintError,
    GrammarSpec,
    LazyConstraint,
    ReasoningGate,
    json_reply_schema,
)
from runner.scheduler.request import GenerationRequest, MediaSpan
from runner.scheduler.scheduler import PromptTooLongError
from runner.server.errors import ApiError, invalid, too_long
from runner.server.images import ImageInput, fetch, refuse_remote
from runner.server.params import ChatParams, CommonParams, CompletionParams
from runner.server.reasoning import CLOSE as REASONING_CLOSE
from runner.server.reasoning import OPEN as REASONING_OPEN
from runner.server.reasoning import ReasoningSplitter
from runner.server.state import ServerState


@dataclass(frozen=True)
class ChatRequest:
    """A chat turn made ready for the engine, whichever dialect asked for it."""

    gens: list[GenerationRequest]  # one per choice (n), each with its own constraint state and seed
    common: CommonParams  # the request's parameters, with the tools' grammar where they need one
    reading: ToolReading | None  # how to read tool calls back from the reply (None: no tools)

    @property
    def gen(self) -> GenerationRequest:
        return self.gens[0]


@dataclass(frozen=True)
class CompletionRequest:
    """A text completion made ready for the engine: per prompt, its group of choices."""

    groups: list[list[GenerationRequest]]  # one per prompt: best_of requests (n when no best_of)
    common: CommonParams
    echoes: list[tuple[str, tuple[int, ...]] | None]  # per prompt, its text and ids when echoed

    @property
    def gens(self) -> list[GenerationRequest]:
        return [gen for group in self.groups for gen in group]


async def chat_request(state: ServerState, params: ChatParams, prefix: str) -> ChatRequest:
    """Template and tokenize the messages (with the tools), compile the reply's grammar."""
    check_writes(state)
    check_n(state, params.common.n)
    prompt_ids, media, tools, reading, common = await _chat_prompt(state, params, prefix)
    reasoning = reasoning_splitter(state, prompt_ids)
    constraints = [await _chat_constraint(state, params, common, reading, reasoning) for _ in range(common.n)]
    first = _generation_request(state, prefix, prompt_ids, common, state.facts.stop, constraints[0], media=media)
    return ChatRequest(choice_requests(first, constraints), common, reading)


async def count_chat_tokens(state: ServerState, params: ChatParams, prefix: str) -> int:
    """The prompt's length in tokens, as chat_request would compute it (nothing is queued)."""
    prompt_ids, *_ = await _chat_prompt(state, params, prefix)
    return len(prompt_ids)


async def _chat_prompt(state: ServerState, params: ChatParams, prefix: str,
                       ) -> tuple[tuple[int, ...], tuple[MediaSpan, ...], list, ToolReading | None, CommonParams]:
    """The prompt's ids and image spans, the tools offered, how calls are read back, and the parameters
    with the tools' grammar (a call once the reply starts one, or at once when one is required)."""
    check_fits(state, sum(len(m.content) for m in params.messages), _prompt_param(prefix))
    tools = list(params.tools) if params.tool_choice != "none" else []
    images = await _image_chunks(state, params.images)
    try:
        prompt_ids, media = await run_in_threadpool(state.loaded.chat_prompt, params.messages, tools or None, images)
    except TemplateLimitError as exc:  # the model's template, not the request, is at fault
        raise ApiError(500, str(exc), "server_error", code="template_limit") from None
    except TemplateError as exc:
        raise invalid(str(exc), "messages", "invalid_messages") from None
    reading, common = None, params.common
    if tools:
        reading = ToolReading(state.facts.tool_syntax, tuple(tools))
        # required or a named function: the reply is a call; auto: a call once the reply starts one, or,
        # beside a JSON reply format, calls or that JSON from the start (the dialects refuse any other format)
        offered = [t for t in tools if params.tool_choice in ("auto", "required", t.name)]
        reply_schema = _reply_schema(common.grammar) if params.tool_choice == "auto" else None
        grammar = call_grammar(reading.syntax, offered, params.parallel_tool_calls, JSON_LAYOUT, reply_schema)
        param = "tools" if reply_schema is None else common.grammar.param  # type: ignore[union-attr]
        common = dataclasses.replace(common, grammar=GrammarSpec("lark", grammar, param))
    return prompt_ids, media, tools, reading, common


def _reply_schema(spec: GrammarSpec | None) -> dict | None:
    """A JSON reply format's schema, as for the format alone (None: no format)."""
    if spec is None:
        return None
    assert spec.kind in JSON_KINDS, "a grammar beside tools is refused at the edge"
    return json_reply_schema(spec.source)


async def _image_chunks(state: ServerState, images: tuple[ImageInput, ...]) -> list:
    """The request's images as the model's spans (400 naming the part: a model without images, an
    image the projector cannot read)."""
    if not images:
        return []
    for image in images:
        if image.kind == "image" and not state.facts.takes_images:
            raise invalid(f"{image.where}: this model takes no images (start it with --mmproj, or choose a "
                          "vision model)", image.where, "model_takes_no_images")
        if image.kind == "audio" and not state.facts.takes_audio:
            raise invalid(f"{image.where}: this model takes no audio (start it with --mmproj FILE, an audio "
                          "projector, or choose a model that hears)", image.where, "model_takes_no_audio")
    spans = []
    for image in images:
        data = image.data
        if image.url:
            if not state.allow_remote_media:
                refuse_remote(image)
            data = await run_in_threadpool(fetch, image)
        try:
            spans.append(await run_in_threadpool(state.loaded.media_spans, data, image.kind))
        except ValueError as exc:  # (runtime.mtmd.MediaError)
            raise invalid(f"{image.where}: {exc}", image.where, f"invalid_{image.kind}") from None
    _check_media_fits(state, images, spans)
    chunks = []
    for image, chunk in zip(images, spans):
        try:
            chunks.append(await run_in_threadpool(state.loaded.encoded, chunk))
        except RuntimeError as exc:  # the projector failed to encode it: the server's fault, said as it is
            raise ApiError(500, f"{image.where}: {exc}", "server_error", code="image_encode_failed") from None
    return chunks


def _check_media_fits(state: ServerState, images: tuple[ImageInput, ...], spans: list[tuple]) -> None:
    """Refuse, before any encoder runs, media whose spans alone take a slot's context (a long clip is
    a span per 30 seconds: an hour of audio would be encoded only to be refused)."""
    n_positions = sum(chunk.n_tokens for chunks in spans for chunk in chunks)
    if n_positions >= state.facts.ctx_size:
        where = images[0].where if len(images) == 1 else "messages"
        raise too_long(f"the request's {len(images)} image(s) and clip(s) take {n_positions} positions; a slot's "
                       f"context holds {state.facts.ctx_size}", where, n_positions, state.facts.ctx_size - 1)


async def _chat_constraint(state: ServerState, params: ChatParams, common: CommonParams, reading: ToolReading | None,
                           reasoning: ReasoningSplitter | None) -> AnyConstraint | None:
    """One choice's grammar state: as compiled; with tools on auto, armed once a call starts; on a
    reasoning model, after its thinking, which the request's thinking budget bounds."""
    constraint = await compile_grammar(state, common)
    spec, loaded = common.grammar, state.loaded
    # a budget needs </think> as one token to end the thought with; without it the model thinks on
    budget = params.thinking_budget if state.think_close_id is not None else None
    lazy = spec is not None and reading is not None and params.tool_choice == "auto" and params.common.grammar is None

    def grammar() -> AnyConstraint:
        assert spec is not None
        if lazy:
            assert reading is not None
            return LazyConstraint(TRIGGERS[reading.syntax], lambda: loaded.compile_constraint(spec),
                                  state.facts.token_bytes)
        return loaded.compile_constraint(spec)

    if constraint is None and budget is None:
        return None
    if lazy and budget is None:
        return grammar()
    if state.think_id is not None:
        return ReasoningGate(grammar if spec is not None else None, state.facts.token_bytes, state.think_id,
                             REASONING_CLOSE, starts_inside=reasoning is not None and reasoning.starts_inside,
                             budget=budget, close_id=state.think_close_id)
    return constraint


async def completion_request(state: ServerState, params: CompletionParams) -> CompletionRequest:
    """Each prompt made ready: its choices, and its text and ids when echoed (a prompt the server
    cannot take is refused by its index when the request holds several)."""
    check_writes(state)
    common = params.common
    check_n(state, params.best_of, "best_of" if params.best_of > common.n else "n")
    n_requests, most = len(params.prompts) * params.best_of, state.facts.n_slots + state.engine_thread.max_queue
    if n_requests > most:
        raise invalid(f"'prompt' holds {len(params.prompts)} prompts of {params.best_of} choice(s) each; this server "
                      f"takes at most {most} requests at once (--parallel plus --max-queue)", "prompt")
    groups, echoes = [], []
    for i, prompt in enumerate(params.prompts):
        try:
            group, echo = await _completion_group(state, params, prompt)
        except ApiError as exc:
            if len(params.prompts) > 1:
                exc.message = f"prompt {i}: {exc.message}"
            raise
        groups.append(group)
        echoes.append(echo)
    return CompletionRequest(groups, common, echoes)


async def _completion_group(state: ServerState, params: CompletionParams, prompt: str | tuple[int, ...]
                            ) -> tuple[list[GenerationRequest], tuple[str, tuple[int, ...]] | None]:
    """Tokenize one prompt (or take its ids), compile best_of grammar states, ask for the logprobs
    best_of ranks by, and score the prompt when it is echoed with logprobs."""
    if params.suffix is not None:
        prompt_ids = await _infill_ids(state, prompt, params.suffix)
    elif isinstance(prompt, tuple):
        prompt_ids = prompt
    else:
        check_fits(state, len(prompt), "prompt")
        prompt_ids = await run_in_threadpool(state.loaded.text_prompt_ids, prompt)
    common = params.common
    constraints = [await compile_grammar(state, common) for _ in range(params.best_of)]
    scoring = params.best_of > common.n and common.n_top_logprobs is None
    engine_common = dataclasses.replace(common, n_top_logprobs=0) if scoring else common  # best_of ranks by them
    scores_prompt = params.echo and common.n_top_logprobs is not None
    first = _generation_request(state, "cmpl", prompt_ids, engine_common, (), constraints[0],
                                common.n_top_logprobs if scores_prompt else None)
    echo = None
    if params.echo:
        text = prompt if isinstance(prompt, str) else state.facts.detokenize(list(prompt_ids))
        echo = (text, prompt_ids)
    return choice_requests(first, constraints), echo


async def _infill_ids(state: ServerState, prefix: str | tuple[int, ...], suffix: str) -> tuple[int, ...]:
    """A fill-in-the-middle prompt (400 naming 'suffix' for a model without the tags)."""
    if not state.facts.fills_in_the_middle:
        raise invalid("'suffix' asks to fill in the middle, and this model has no fill-in-the-middle tokens (a code "
                      "model has them, e.g. Qwen2.5-Coder)", "suffix", "unsupported_parameter")
    check_fits(state, len(suffix) + (len(prefix) if isinstance(prefix, str) else 0), "prompt")
    return await run_in_threadpool(state.loaded.infill_prompt_ids, prefix, suffix)


def check_writes(state: ServerState) -> None:
    """An embedding model writes no replies: a 400 naming the model (Ollama's 'does not support chat')."""
    try:
        state.facts.check_writes()
    except InputError as exc:
        raise invalid(str(exc), "model", "model_does_not_generate") from None


def check_n(state: ServerState, n: int, param: str = "n") -> None:
    n_slots = state.facts.n_slots
    if n > n_slots:
        raise invalid(f"'{param}' is {n}, but this server has {n_slots} slots (--parallel {n_slots}) and each "
                      f"choice takes one; ask for at most {n_slots}", param)


def _prompt_param(prefix: str) -> str:
    """The request parameter that holds the prompt, by the endpoint's id prefix."""
    return {"cmpl": "prompt", "resp": "input"}.get(prefix, "messages")


def check_fits(state: ServerState, n_chars: int, param: str) -> None:
    """Text that cannot fit a slot is refused before it is tokenized."""
    try:
        state.facts.check_text_fits(n_chars)
    except PromptTooLongError as exc:
        raise too_long(str(exc), param, exc.n_tokens, exc.n_max) from None


async def compile_grammar(state: ServerState, common: CommonParams) -> Constraint | None:
    """The request's grammar, compiled before any token is generated (400 naming the parameter if it cannot be)."""
    if common.grammar is None:
        return None
    try:
        return await run_in_threadpool(state.loaded.compile_constraint, common.grammar)
    except ConstraintError as exc:
        raise invalid(str(exc), common.grammar.param, "invalid_grammar") from None


def reasoning_splitter(state: ServerState, prompt_ids: tuple[int, ...]) -> ReasoningSplitter | None:
    """A splitter for a chat reply's reasoning (one per choice: it keeps state); it starts inside
    when the template opened the tag."""
    if state.reasoning_format == "none":
        return None
    prompt_tail = state.facts.detokenize(list(prompt_ids[-4:])).rstrip()
    return ReasoningSplitter(starts_inside=prompt_tail.endswith(REASONING_OPEN))


def _generation_request(
    state: ServerState, prefix: str, prompt_ids: tuple[int, ...], common: CommonParams, extra_stop: tuple[str, ...],
    constraint: AnyConstraint | None = None, prompt_logprobs: int | None = None, media: tuple[MediaSpan, ...] = (),
) -> GenerationRequest:
    """The first choice's request, after the one check that its prompt fits a slot."""
    facts = state.facts
    try:
        facts.check_token_ids([t for t in prompt_ids if t >= 0] if media else prompt_ids)  # (images: placeholders)
    except TokenIdError as exc:
        raise invalid(f"prompt {exc}", "prompt") from None
    try:
        facts.check_token_ids([t for t, _ in common.sampling.logit_bias])
    except TokenIdError as exc:
        raise invalid(f"'logit_bias' {exc}", "logit_bias") from None
    try:
        facts.check_prompt(len(prompt_ids))
    except PromptTooLongError as exc:
        of_images = (f" ({sum(s.n_tokens for s in media)} of them for its {len(media)} image(s))" if media else "")
        raise too_long(f"{exc}{of_images}", _prompt_param(prefix), exc.n_tokens, exc.n_max) from None
    max_tokens = reply_length(common.max_tokens, facts.default_max_tokens, facts.room_after(len(prompt_ids)))
    return generation_request(new_request_id(prefix), prompt_ids, common.sampling, max_tokens,
                              common.stop + extra_stop, constraint, common.n_top_logprobs, common.ignore_eos,
                              prompt_logprobs, common.beam, media)


async def embedding_ids(state: ServerState, texts: list[str], param: str = "input") -> list[list[int]]:
    """Texts tokenized for embedding (each refused first if it cannot fit a slot)."""
    for text in texts:
        check_fits(state, len(text), param)
    return await run_in_threadpool(lambda: [state.loaded.embedding_ids(t) for t in texts])


async def embed(state: ServerState, ids: list[list[int]], param: str = "input") -> list[np.ndarray]:
    """One vector per input, from the embedding thread (beside the engine's step loop)."""
    thread = await run_in_threadpool(state.embedding_thread)
    try:
        future = thread.submit(ids)
    except InputTooLongError as exc:
        raise invalid(str(exc), param, "context_length_exceeded") from None
    return await asyncio.wrap_future(future)
