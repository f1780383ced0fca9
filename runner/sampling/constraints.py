"""Constrained decoding: a request's grammar (a JSON schema, any JSON object, Lark or GBNF) compiled
by llguidance into a per-request matcher that masks the sampler's logits rows.

The matcher advances with every token the request commits (the sampler's accept), so a
speculative row is verified position by position against the masked distribution: drafts stay
lossless. Only what cannot be continued is masked; no token the grammar allows is ever lost.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.core.errors import RunnerError
from runner.core.json_schemas import closed_objects

KINDS = ("json_schema", "json_object", "lark", "gbnf")
JSON_KINDS = ("json_schema", "json_object")  # (a reply format: what may stand beside tools)
# JSON on one line with the usual separators: no run-away whitespace, and the keys and punctuation
# between values are forced (jump-forward decodes them in one step)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# llguidance's Earley rows grow by 2-4 items per optional property of an object (its default cap,
# 2,000, failed a 1,100-property schema mid-reply); 10,000 keeps ~2,500 such properties working at
# ~25 ms a mask on a CPU core, and bounds what one request's grammar costs the whole step
MAX_ITEMS_IN_ROW = 10_000


class ConstraintError(RunnerError):
    """A schema or grammar that cannot be compiled (or a token it cannot take)."""


@dataclass(frozen=True)
class GrammarSpec:
    """What a request asked its reply to follow, as plain data (parsed at the edge)."""

    kind: str  # one of KINDS
    source: str  # the JSON schema as JSON text, or the grammar's text
    param: str  # the request parameter it came from, for errors ("response_format", "grammar")


def json_reply_schema(source: str) -> dict[str, Any]:
    """A JSON reply format's schema (its text), objects closed as llama.cpp's server closes them. No
    schema, or the empty one: any object (a bare number or string would rarely be what is meant, and
    a model may write digits until its tokens run out)."""
    return (closed_objects(json.loads(source)) if source else {}) or {"type": "object"}


@functools.lru_cache(maxsize=128)
def grammar_text(kind: str, source: str) -> str:
    """llguidance's grammar for a spec (cached: a repeated schema is translated once)."""
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    if kind in JSON_KINDS:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(json_reply_schema(source)),
                                                             defaults=JSON_LAYOUT)
    if kind == "gbnf":
        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(source))
    return llguidance.LLMatcher.grammar_from_lark(source)


def compile_constraint(spec: GrammarSpec, tokenizer: Any, n_vocab: int) -> Constraint:
    """A fresh matcher for one request; ConstraintError (with llguidance's reason) if it cannot compile."""
    import llguidance

    try:
        grammar = grammar_text(spec.kind, spec.source)
    except Exception as exc:  # noqa: BLE001 - the translators raise assorted errors on bad input
        raise ConstraintError(f"{spec.param}: {exc}") from None
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=_parser_limits())
    if matcher.is_error():
        raise ConstraintError(f"{spec.param}: {matcher.get_error()}")
    return Constraint(matcher, n_vocab, (tokenizer.vocab_size + 31) // 32)


@functools.cache
def _parser_limits() -> Any:
    """llguidance's limits, with errors that say what failed without the parser's state (kilobytes)."""
    import llguidance

    return llguidance.LLParserLimits(max_items_in_row=MAX_ITEMS_IN_ROW, verbose_errors=False)


def _reason(error: str) -> str:
    """A failed step's error in one line (a non-verbose error still ends with a `<non-verbose/>` mark;
    a grammar's compile errors keep their lines, which point at the fault)."""
    return error.split("\n", 1)[0]


_executor: Any = None  # llguidance's thread pool, made on first use


def prefetch_masks(constraints: list[AnyConstraint]) -> None:
    """Compute the next mask of several requests at once on llguidance's thread pool, so the
    step's serial Python does not grow by a mask per constrained slot."""
    global _executor
    matchers = [c.current for c in constraints]
    constraints = [m for m in matchers if m is not None]  # (a thinking budget alone has no matcher)
    if len(constraints) < 2:
        return
    import llguidance

    if _executor is None:
        _executor = llguidance.LLExecutor()
    n_words = constraints[0].n_mask_words
    masks = np.full((len(constraints), n_words), -1, dtype=np.int32)
    _executor.unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(constraints)], masks.ctypes.data,
                                      n_words * 4, len(constraints))
    for constraint, mask in zip(constraints, masks):
        constraint.next_bits = mask.view(np.uint8)


class Constraint:
    """One request's grammar state (an llguidance LLMatcher): masks, advances, forces."""

    def __init__(self, matcher: Any, n_vocab: int, n_mask_words: int) -> None:
        self.matcher = matcher
        self._n_vocab = n_vocab
        self.n_mask_words = n_mask_words  # 32-bit words of llguidance's token mask
        self.next_bits: np.ndarray | None = None  # the mask for the current state, when prefetch_masks made it

    def allowed(self) -> np.ndarray:
        """A bool per token: may it come next?"""
        bits = self.next_bits
        if bits is None:
            bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self._n_vocab].astype(bool)

    def mask_into(self, logits: np.ndarray) -> None:
        """Set the logits of every token the grammar forbids next to -inf (in place)."""
        logits[~self.allowed()] = -np.inf

    def advance(self, token_id: int) -> None:
        self.next_bits = None  # it was the mask before this token
        if not self.matcher.consume_token(token_id):
            raise ConstraintError(f"the grammar cannot take token {token_id}: {_reason(self.matcher.get_error())}")

    def n_valid(self, token_ids: list[int]) -> int:
        """How many leading token_ids the grammar would take from here (drafts past that are cut)."""
        return self.matcher.validate_tokens(token_ids) if token_ids else 0

    @property
    def is_active(self) -> bool:
        return True

    @property
    def current(self) -> Constraint:
        """The matcher-backed constraint in force (itself; a LazyConstraint's once triggered)."""
        return self

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar allows as the only continuation from here (jump-forward)."""
        return list(self.matcher.compute_ff_tokens())

    @property
    def is_done(self) -> bool:
        """Nothing but end-of-text may follow."""
        return bool(self.matcher.is_stopped())


class DeferredConstraint:
    """A grammar that holds from some point of the reply on: before `active` is set nothing is
    masked and tokens go to `_watch`, which decides when the grammar starts."""

    def __init__(self) -> None:
        self.active: Constraint | None = None

    @property
    def is_active(self) -> bool:
        return self.active is not None

    @property
    def current(self) -> Constraint:
        assert self.active is not None
        return self.active

    def mask_into(self, logits: np.ndarray) -> None:
        if self.active is not None:
            self.active.mask_into(logits)

    def advance(self, token_id: int) -> None:
        if self.active is not None:
            self.active.advance(token_id)
        else:
            self._watch(token_id)

    def _watch(self, token_id: int) -> None:
        raise NotImplementedError

    def n_valid(self, token_ids: list[int]) -> int:
        return self.active.n_valid(token_ids) if self.active is not None else len(token_ids)

    def forced_tokens(self) -> list[int]:
        return self.active.forced_tokens() if self.active is not None else []

    @property
    def is_done(self) -> bool:
        return self.active is not None and self.active.is_done


class LazyConstraint(DeferredConstraint):
    """A grammar that starts where the reply starts a trigger (a tool call, with tool_choice auto):
    before it nothing is masked, so text replies are not slowed; from the token the trigger begins
    at, the grammar takes every token. A trigger that begins inside a token, or text the grammar
    refuses, leaves the reply unconstrained (it is still read for calls when it ends)."""

    def __init__(self, trigger: str, make: Callable[[], Constraint], token_bytes: Callable[[int], bytes]) -> None:
        super().__init__()
        self._trigger = trigger.encode()
        self._make = make
        self._token_bytes = token_bytes
        self._text = bytearray()
        self._starts: list[int] = []  # byte offset of each committed token in _text
        self._ids: list[int] = []
        self._gave_up = False

    def _watch(self, token_id: int) -> None:
        if self._gave_up:
            return
        old_len = len(self._text)
        self._starts.append(old_len)
        self._ids.append(token_id)
        self._text += self._token_bytes(token_id)
        # only the new token's bytes (and a trigger's length before them) can complete the trigger
        at = self._text.find(self._trigger, max(0, old_len - len(self._trigger) + 1))
        if at < 0:
            return
        if at not in self._starts:
            self._gave_up = True
            return
        constraint = self._make()
        try:
            for t in self._ids[self._starts.index(at):]:
                constraint.advance(t)
        except ConstraintError:
            self._gave_up = True
            return
        self.active = constraint


class ReasoningGate(DeferredConstraint):
    """A reasoning model's reply: it may open with the think token and think freely until the
    closing tag, then a grammar (if any) takes over from the next token. If the template already
    opened the tag (`starts_inside`), the reply begins thinking; else the first token is the
    grammar's or the think token. A close tag that ends inside a token leaves the reply
    unconstrained (as a LazyConstraint's misplaced trigger does).

    `budget`: the most tokens of thinking (a request's thinking budget or effort); at the budget
    the close tag (`close_id`, a single token) is the only token allowed, and with 0 the reply does
    not open the thinking at all. No budget: the model thinks as long as it does."""

    def __init__(self, make: Callable[[], AnyConstraint] | None, token_bytes: Callable[[int], bytes], think_id: int,
                 close: str = "</think>", starts_inside: bool = False, budget: int | None = None,
                 close_id: int | None = None) -> None:
        self._make = make
        self._token_bytes = token_bytes
        self._think_id = think_id
        self._close = close.encode()
        self._thought = bytearray()
        self._n_thought = 0  # tokens of thinking so far
        self._budget = budget if close_id is not None else None
        self._close_id = close_id
        self._gave_up = False
        # the grammar after the thinking (a matcher, or a lazy one); from the first token unless it thinks
        self.active: AnyConstraint | None = None if starts_inside or make is None else make()
        self._may_think = not starts_inside  # the first token: the grammar's, or the think token
        self._thinking = starts_inside

    @property
    def _at_budget(self) -> bool:
        return self._thinking and self._budget is not None and self._n_thought >= self._budget

    @property
    def is_active(self) -> bool:
        """Masking: the grammar, or the budget (the close tag now; no think token with budget 0)."""
        return ((self.active is not None and self.active.is_active) or self._at_budget
                or (self._may_think and self._budget == 0))

    @property
    def current(self) -> Constraint | None:  # type: ignore[override]
        """The matcher in force (None while the budget alone masks)."""
        return self.active.current if self.active is not None and self.active.is_active else None

    def mask_into(self, logits: np.ndarray) -> None:
        if self._at_budget:
            assert self._close_id is not None
            close = logits[self._close_id]
            logits[:] = -np.inf
            logits[self._close_id] = close
            return
        think = logits[self._think_id]
        if self.active is not None:
            self.active.mask_into(logits)
        if self._may_think:  # the first token may open the thinking, unless the budget is 0
            logits[self._think_id] = -np.inf if self._budget == 0 else think

    def advance(self, token_id: int) -> None:
        if self._may_think:
            self._may_think = False
            if token_id == self._think_id:
                self.active, self._thinking = None, True
                return
        super().advance(token_id)

    def _watch(self, token_id: int) -> None:
        if not self._thinking or self._gave_up:
            return
        self._n_thought += 1
        self._thought += self._token_bytes(token_id)
        at = self._thought.find(self._close)
        if at < 0:
            return
        self._thinking = False
        if at + len(self._close) != len(self._thought):
            self._gave_up = True  # the tag ended inside a token: nothing to start the grammar at
            return
        self.active = self._make() if self._make is not None else None

    def n_valid(self, token_ids: list[int]) -> int:
        if self._may_think and token_ids and token_ids[0] == self._think_id:
            return 0 if self._budget == 0 else 1  # (what follows the think token is thinking: drafted again)
        if self._thinking and self._budget is not None:  # drafts stop where the budget does
            room = max(0, self._budget - self._n_thought)
            if self._close_id in token_ids[:room + 1]:
                return token_ids.index(self._close_id) + 1  # (the grammar, if any, starts after: drafted again)
            return min(len(token_ids), room)
        return super().n_valid(token_ids)

    def forced_tokens(self) -> list[int]:
        if self._at_budget:
            assert self._close_id is not None
            return [self._close_id]
        return [] if self._may_think else super().forced_tokens()


# what a request may carry as its grammar
AnyConstraint = Constraint | DeferredConstraint
