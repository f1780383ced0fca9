"""Chat templates: the GGUF's `tokenizer.chat_template` rendered in a jinja2 sandbox."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runner.core.errors import RunnerError
from runner.prompt.tools import (
    Tool,
    ToolCall,
    fallback_system_prompt,
    template_knows_tools,
)

# Used when a model carries no template (base models): plain turns the model can continue.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_STOP = ("\nUser:",)

ROLES = ("system", "user", "assistant", "developer", "tool")
# A template comes from an untrusted GGUF: its rendering is bounded in time and output
RENDER_TIMEOUT_S = 2.0
MAX_RENDER_CHARS = 4_000_000
MAX_POWER_EXPONENT = 64


class TemplateError(RunnerError):
    """The chat template refused the conversation (e.g. roles out of order)."""


class TemplateLimitError(TemplateError):
    """The model's template ran too long or wrote too much: the model's fault, not the request's."""


_render_budget = threading.local()  # the deadline of the rendering on this thread


def _check_budget() -> None:
    deadline = getattr(_render_budget, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimitError("the model's chat template ran too long (RENDER_TIMEOUT_S)")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The jinja2 sandbox, plus a deadline checked on every call, attribute and item access (a
    loop does one of those per turn), and no string or power larger than the limits."""

    intercepted_binops = frozenset({"*", "**"})

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's names
        _check_budget()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_budget()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_budget()
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_budget()
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_POWER_EXPONENT:
            raise TemplateLimitError(f"the model's chat template raises to a power over {MAX_POWER_EXPONENT}")
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_RENDER_CHARS:
                    raise TemplateLimitError("the model's chat template builds a value over "
                                             f"{MAX_RENDER_CHARS} items")
        return super().call_binop(context, operator, left, right)


IMAGE_MARK = "\ue001"  # around an image's index where it goes in a message's content (private use; LoadedModel.chat_prompt)


def image_mark(index: int) -> str:
    """The text that stands for the request's index-th image in a message's content."""
    return f"{IMAGE_MARK}{index}{IMAGE_MARK}"


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn that called functions
    tool_call_id: str | None = None  # a tool turn: the call it answers

    def written_out(self) -> Message:
        """For a template that knows no tools (it would drop them): an assistant's calls written into
        its content in the syntax the fallback system prompt teaches, a tool's result marked as one."""
        if self.tool_calls:
            blocks = "".join("<tool_call>" + json.dumps({"name": c.name, "arguments": _arguments_object(c.arguments)},
                                                        ensure_ascii=False) + "</tool_call>" for c in self.tool_calls)
            return Message(self.role, self.content + ("\n" if self.content else "") + blocks)
        if self.role == "tool":
            return Message(self.role, f"<tool_response>{self.content}</tool_response>")
        return self

    def as_template_dict(self) -> dict[str, Any]:
        """The message as chat templates expect it (arguments as objects, as Hugging Face's do)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": _arguments_object(c.arguments)}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _raise(message: str) -> None:
    raise TemplateError(f"chat template error: {message}")


@dataclass
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""
    is_fallback: bool = False
    stop: tuple[str, ...] = field(default=())
    render_timeout_s: float = RENDER_TIMEOUT_S

    def __post_init__(self) -> None:
        env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"the model's chat template does not parse: {exc}") from None

    @classmethod
    def for_model(cls, source: str | None, bos_token: str, eos_token: str) -> ChatTemplate:
        if source:
            return cls(source, bos_token, eos_token)
        return cls(FALLBACK_TEMPLATE, bos_token, eos_token, is_fallback=True, stop=FALLBACK_STOP)

    @property
    def knows_tools(self) -> bool:
        return template_knows_tools(None if self.is_fallback else self.source)

    @property
    def renders_calls(self) -> bool:
        """Whether it writes an assistant's tool_calls (else they are written into its content)."""
        return not self.is_fallback and "tool_calls" in self.source

    def render(self, messages: list[Message], add_generation_prompt: bool = True, tools: list[Tool] | None = None) -> str:
        """The prompt text; TemplateLimitError past render_timeout_s or MAX_RENDER_CHARS.

        Tools go to a template that knows them; otherwise they are described in a system message."""
        if not self.renders_calls:
            messages = [m.written_out() for m in messages]
        if tools and not self.knows_tools:
            messages = [Message("system", fallback_system_prompt(tools)), *messages]
        extra = {"tools": [t.as_openai() for t in tools]} if tools and self.knows_tools else {}
        _render_budget.deadline = time.monotonic() + self.render_timeout_s
        pieces, n_chars = [], 0
        try:
            for piece in self._template.generate(
                messages=[m.as_template_dict() for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            ):
                n_chars += len(piece)
                if n_chars > MAX_RENDER_CHARS:
                    raise TemplateLimitError(f"the model's chat template wrote over {MAX_RENDER_CHARS} characters")
                _check_budget()
                pieces.append(piece)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template error: {exc}") from None
        finally:
            _render_budget.deadline = None
        return "".join(pieces)
