"""The Python API: generate in the caller's thread by stepping the engine until the reply ends.

    from runner import Runner
    with Runner("smollm2-135m-instruct", parallel=1) as r:
        print(r.chat([{"role": "user", "content": "Hi"}], temperature=0))
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runner.catalog.store import ModelStore
from runner.config.options import EngineOptions
from runner.core.errors import InputError, RunnerError
from runner.model.loaded_model import LoadedModel
from runner.model.request_builder import (
    beam_requests,
    choice_requests,
    generation_request,
    reply_length,
)
from runner.prompt.chat_template import ROLES, Message
from runner.sampling.constraints import Constraint, GrammarSpec
from runner.sampling.params import SamplingParams, checked_sampling
from runner.scheduler.engine import Engine
from runner.scheduler.request import BeamParams, GenerationRequest, StreamEvent

_ids = itertools.count(1)
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


@dataclass(frozen=True)
class BeamReply:
    text: str
    logprob: float  # the model's summed log-probability of its tokens
    finish_reason: str  # "stop" (end of generation) or "length"


def _messages(messages: list[dict[str, str]] | list[Message]) -> list[Message]:
    """The conversation as Messages (a role the server would refuse, or none at all: InputError)."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Message):
            out.append(m)
        elif isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str):
            out.append(Message(m["role"], m["content"]))
        else:
            raise InputError(f"messages[{i}] must be a Message or {{'role': str, 'content': str}}, got {m!r:.80}")
        if out[-1].role not in ROLES:
            raise InputError(f"messages[{i}]'s role must be one of {', '.join(ROLES)}; got {out[-1].role!r:.40}")
        if out[-1].role == "developer":  # (OpenAI's newer name for the system prompt, as the server takes it)
            out[-1] = dataclasses.replace(out[-1], role="system")
    if not out:
        raise InputError("messages is empty: give at least one message")
    return out


def _text(events: list[StreamEvent] | Iterator[StreamEvent]) -> str:
    """A reply's text (RunnerError: its generation failed, e.g. a grammar or sampling error)."""
    parts = []
    for event in events:
        if event.error is not None:
            raise RunnerError(event.error)
        parts.append(event.text)
    return "".join(parts)


def _stops(stop: str | Sequence[str]) -> tuple[str, ...]:
    """One stop string, or several."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) for s in stops):
        raise InputError(f"stop must be a text or a list of texts, got {stop!r:.80}")
    return stops


def _step(engine: Engine) -> None:
    """One engine step. One that raises ends every request with the error and trusts no slot's KV
    (the server's engine thread does the same), so no later call reuses what it left behind."""
    try:
        engine.step()
    except Exception as exc:
        engine.scheduler.fail_all(f"internal error: {exc}")
        raise


class Runner:
    """One model, generating in the caller's thread. Several threads may call it at once: one engine
    step runs at a time, and each step advances every thread's requests (up to `parallel` at once)."""

    def __init__(self, model: str | Path = "smollm2-135m-instruct", log: Any = None, store: ModelStore | None = None,
                 **options: Any) -> None:
        """`store`: where models are cached and pulled from (default: the user's cache, with progress)."""
        engine_options = EngineOptions(**{"parallel": 1, **options})
        kwargs = {"log": log} if log is not None else {}
        self._loaded: LoadedModel | None = LoadedModel(model, engine_options, store=store, **kwargs)
        self._lock = threading.Lock()  # the engine's: a step, a submit, a cancel or close at a time
        # a Runner dropped without close() frees its model when collected (its native memory stayed)
        self._free = weakref.finalize(self, self._loaded.close)
        self._embed_lock = threading.Lock()  # the embedding context's: one batch at a time

    @property
    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            raise RunnerError("this Runner is closed")
        return self._loaded

    def _step_until(self, done: Callable[[], bool]) -> None:
        """Step the engine (whichever thread's requests it holds) until done() or it has no work left
        (RunnerError: another thread closed the Runner)."""
        while not done():
            with self._lock:
                engine = self.loaded.engine
                if not engine.has_work:
                    return
                if not done():
                    _step(engine)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self, prompt_ids: tuple[int, ...], max_tokens: int | None = None, stop: str | Sequence[str] = (),
        json_schema: dict | str | None = None, grammar: str | None = None, *, media: tuple[Any, ...] = (),
        **sampling: Any
    ) -> GenerationRequest:
        """max_tokens: EngineOptions.max_tokens when not given (0: nothing; never past the slot's context).
        json_schema (a dict or JSON text; {} or {"type": "object"}: any object) or grammar (Lark or GBNF):
        what the reply must follow (ConstraintError if it cannot compile). media: the image spans a
        prompt from LoadedModel.chat_prompt holds (their places hold ids outside the vocabulary)."""
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 0):
            raise InputError(f"max_tokens must be a whole number, 0 or more (None: the default), got {max_tokens!r}")
        facts = self.loaded.facts
        facts.check_writes()  # (InputError: an embedding model's reply would be noise)
        if not media:
            facts.check_token_ids(prompt_ids)  # (TokenIdError: an id llama_decode would be handed otherwise)
        length = reply_length(max_tokens, facts.default_max_tokens, facts.room_after(len(prompt_ids)))
        params = checked_sampling(**sampling)
        facts.check_token_ids([t for t, _ in params.logit_bias])
        return generation_request(f"api-{next(_ids)}", prompt_ids, params, length, _stops(stop),
                                  self._constraint(json_schema, grammar), media=media)

    def _constraint(self, json_schema: dict | str | None, grammar: str | None) -> Constraint | None:
        if json_schema is not None and grammar is not None:
            raise InputError("give json_schema or grammar, not both")
        if json_schema is not None:
            text = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
            return self.loaded.compile_constraint(GrammarSpec("json_schema", text, "json_schema"))
        if grammar is not None:
            return self.loaded.compile_constraint(GrammarSpec("gbnf", grammar, "grammar"))
        return None

    def stream(self, request: GenerationRequest) -> Iterator[StreamEvent]:
        """Yield events as the engine produces them; closing the iterator cancels the request."""
        events: list[StreamEvent] = []
        with self._lock:
            self.loaded.engine.submit(request, events.append)
        finished = False
        try:
            while not finished:
                self._step_until(lambda: bool(events))
                if not events:  # (the engine ended with no final event for it: nothing more will come)
                    return
                while events:
                    event = events.pop(0)
                    finished = finished or event.is_final
                    yield event
        finally:
            if not finished:
                self._cancel([request], lambda: any(e.is_final for e in events))

    def _cancel(self, requests: list[GenerationRequest], done: Callable[[], bool] | None = None) -> None:
        """Cancel requests (a Runner closed meanwhile took them with it); `done`: step until it holds
        (their slots are free then)."""
        with self._lock:
            if self._loaded is None:
                return
            for request in requests:
                self._loaded.engine.cancel(request.request_id)
        if done is not None:
            try:
                self._step_until(done)
            except RunnerError:  # (closed by another thread while stepping: nothing is left to free)
                pass

    def stream_chat(self, messages: list[dict[str, str]] | list[Message], images: Sequence[bytes | Path | str] = (),
                    **kwargs: Any) -> Iterator[StreamEvent]:
        """`images`: the conversation's images in order (PNG, JPEG, ... bytes or files; audio clips
        too, WAV, MP3, FLAC, where the projector hears), each placed where a message's content holds
        `image_mark(i)` (prompt.chat_template); the model needs a projector (--mmproj). RunnerError:
        a model without one, a file or clip it cannot read or take."""
        kwargs["stop"] = _stops(kwargs.get("stop", ())) + self.loaded.facts.stop
        if not images:
            return self.stream(self.request(self.loaded.chat_prompt_ids(_messages(messages)), **kwargs))
        prompt_ids, media = self.loaded.chat_prompt(_messages(messages), None, self._image_chunks(images))
        return self.stream(self.request(prompt_ids, media=tuple(media), **kwargs))

    def chat(self, messages: list[dict[str, str]] | list[Message], images: Sequence[bytes | Path | str] = (),
             **kwargs: Any) -> str:
        return _text(self.stream_chat(messages, images, **kwargs))

    def _image_chunks(self, images: Sequence[bytes | Path | str]) -> list[Any]:
        """Each image (or audio clip: wav, mp3, flac, told apart from the bytes) as the model's span,
        encoded (LoadedModel.media_chunks)."""
        if not (self.loaded.facts.takes_images or self.loaded.facts.takes_audio):
            raise RunnerError(f"{self.loaded.name} takes no images: give it a vision projector (--mmproj FILE)")
        chunks = []
        for image in images:
            image = Path(image) if isinstance(image, str) else image  # (a path, as the model may be given)
            where = str(image) if isinstance(image, Path) else f"image {len(chunks) + 1}"
            try:
                data = image.read_bytes() if isinstance(image, Path) else image
                chunks.append(self.loaded.media_chunks(data))
            except OSError as exc:
                raise RunnerError(f"cannot read {where}: {exc.strerror}") from None
            except ValueError as exc:  # (runtime.mtmd.MediaError)
                raise RunnerError(f"{where}: {exc}") from None
            except RuntimeError as exc:  # the projector failed to encode it
                raise RunnerError(f"{where}: {exc}") from None
        return chunks

    def complete(self, prompt: str, **kwargs: Any) -> str:
        request = self.request(self.loaded.text_prompt_ids(prompt), **kwargs)
        return _text(self.stream(request))

    def _prompt_ids(self, prompt: str | list[dict[str, str]] | list[Message]) -> tuple[int, ...]:
        """A text prompt as is; messages through the chat template."""
        if isinstance(prompt, str):
            return self.loaded.text_prompt_ids(prompt)
        return self.loaded.chat_prompt_ids(_messages(prompt))

    def _run_group(self, requests: list[GenerationRequest]) -> list[list[StreamEvent]]:
        """Each request's events (RunnerError: one of them failed)."""
        out: list[list[StreamEvent]] = [[] for _ in requests]
        with self._lock:
            self.loaded.engine.submit_group(requests, [events.append for events in out])
        finished = False
        try:
            self._step_until(lambda: all(events and events[-1].is_final for events in out))
            finished = True
        finally:
            if not finished:  # (interrupted: the group ends, not waits for the next call)
                self._cancel(requests)
        for events in out:
            _text(events)
        return out

    def choices(self, prompt: str | list[dict[str, str]] | list[Message], n: int = 2, best_of: int | None = None,
                **kwargs: Any) -> list[str]:
        """n replies to one prompt (computed once; choice i samples with seed + i). With best_of,
        that many are generated and the n with the highest mean token logprob returned, best first.
        Needs parallel >= n (or best_of)."""
        count = best_of or n
        if not 1 <= n <= count <= self.loaded.options.parallel:
            raise ValueError(f"need 1 <= n <= best_of <= parallel ({self.loaded.options.parallel})")
        if not isinstance(prompt, str):
            kwargs["stop"] = _stops(kwargs.get("stop", ())) + self.loaded.facts.stop
        first = dataclasses.replace(self.request(self._prompt_ids(prompt), **kwargs), n_top_logprobs=0)
        constraints = [first.constraint] + [self._constraint(kwargs.get("json_schema"), kwargs.get("grammar"))
                                            for _ in range(count - 1)]
        requests = choice_requests(first, constraints)
        replies = []
        for events in self._run_group(requests):
            logprobs = [lp.logprob for e in events for lp in e.logprobs]
            replies.append((sum(logprobs) / max(1, len(logprobs)), _text(events)))
        if best_of is None:
            return [text for _, text in replies]
        return [text for _, text in sorted(replies, key=lambda r: -r[0])[:n]]

    def score(self, text: str) -> list[tuple[str, float | None]]:
        """Each token of `text` with its log-probability given the ones before it (the first: None)."""
        ids = self.loaded.text_prompt_ids(text)
        (events,) = self._run_group([GenerationRequest(f"api-{next(_ids)}", ids, max_tokens=0, prompt_logprobs=0)])
        scored = [lp.logprob for e in events for lp in e.prompt_logprobs]
        token = self.loaded.facts.prompt_token_bytes  # (its control tokens by their text, as written)
        return [(token(t).decode("utf-8", "replace"), lp) for t, lp in zip(ids, [None, *scored], strict=True)]

    def beam_search(self, prompt: str | list[dict[str, str]] | list[Message], n: int = 4,
                    max_tokens: int | None = None, length_penalty: float = 1.0,
                    early_stopping: bool = False) -> list[BeamReply]:
        """The n best continuations by beam search (a text prompt as is, messages through the chat
        template), best first. Needs n slots: open the Runner with parallel >= n."""
        if n < 2 or n > self.loaded.options.parallel:
            raise ValueError(f"beam search needs 2 <= n <= parallel ({self.loaded.options.parallel}); got {n}")
        if max_tokens == 0:
            raise InputError("beam search ranks continuations: max_tokens must be at least 1")
        requests = beam_requests(self.request(self._prompt_ids(prompt), max_tokens), n,
                                 BeamParams(length_penalty, early_stopping))
        finals = self._run_group(requests)
        return [BeamReply(e.text, sum(lp.logprob for lp in e.logprobs),
                          "length" if e.finish_reason is not None and e.finish_reason.value == "length" else "stop")
                for e in (out[-1] for out in finals)]

    def embed(self, texts: str | list[str]) -> np.ndarray:
        """One unit-length vector per text, (len(texts), dimensions): the model's own pooling for an
        embedding model, else the mean of its last hidden states (on a context of its own)."""
        batch = [texts] if isinstance(texts, str) else list(texts)
        if not batch or any(not isinstance(t, str) or not t for t in batch):
            raise InputError("embed() needs non-empty texts")
        with self._embed_lock:
            return self.loaded.embedder().embed([self.loaded.embedding_ids(t) for t in batch])

    def close(self) -> None:
        """Free the model once the step or embedding in progress ends; calling it again does
        nothing, and any other call (another thread's generation too) raises RunnerError."""
        with self._lock, self._embed_lock:
            if self._loaded is not None:
                self._free()
                self._loaded = None
