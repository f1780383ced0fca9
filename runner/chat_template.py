"""Chat templates: the GGUF's `tokenizer.chat_template` rendered in a jinja2 sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runner.errors import RunnerError

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


class TemplateError(RunnerError):
    """The chat template refused the conversation (e.g. roles out of order)."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str


def _raise(message: str) -> None:
    raise TemplateError(f"chat template error: {message}")


@dataclass
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""
    is_fallback: bool = False
    stop: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
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

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template error: {exc}") from None
