import pytest

from runner.prompt.chat_template import FALLBACK_STOP, ChatTemplate, Message, TemplateError, TemplateLimitError

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_renders_turns_and_generation_prompt() -> None:
    t = ChatTemplate.for_model(CHATML, "", "")
    text = t.render([Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello"), Message("user", "Bye")])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )


def test_fallback_for_models_without_template() -> None:
    t = ChatTemplate.for_model(None, "<s>", "</s>")
    assert t.is_fallback and t.stop == FALLBACK_STOP
    assert t.render([Message("system", "S"), Message("user", "Q")]) == "S\n\nUser: Q\nAssistant:"


def test_raise_exception_becomes_template_error() -> None:
    t = ChatTemplate.for_model("{{ raise_exception('roles must alternate') }}", "", "")
    with pytest.raises(TemplateError, match="roles must alternate"):
        t.render([Message("user", "x")])


def test_sandbox_blocks_python_internals() -> None:
    t = ChatTemplate.for_model("{{ ''.__class__.__mro__[1].__subclasses__() }}", "", "")
    with pytest.raises(TemplateError):
        t.render([Message("user", "x")])


def test_bad_syntax_is_reported() -> None:
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate.for_model("{% for %}", "", "")


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",  # 10^10 empty turns
    "{% for i in range(100000) %}{% for m in messages %}{{ m.role[:0] }}{% endfor %}{% endfor %}x" * 100,
])
def test_a_template_that_runs_too_long_is_stopped(source: str) -> None:
    t = ChatTemplate(source, render_timeout_s=0.05)
    with pytest.raises(TemplateLimitError, match="ran too long"):
        t.render([Message("user", "x")])


@pytest.mark.parametrize(("source", "match"), [
    ("{% for i in range(100000) %}{{ 'abcdefghij' * 10 }}{% endfor %}", "wrote over"),  # 10 M characters
    ("{{ 'x' * 1000000000 }}", "builds a value over"),
    ("{{ [1] * 10 ** 12 }}", "power over|builds a value over"),
    ("{{ 9 ** 99999999 }}", "power over"),
])
def test_a_template_that_writes_too_much_is_stopped(source: str, match: str) -> None:
    with pytest.raises(TemplateLimitError, match=match):
        ChatTemplate(source).render([Message("user", "x")])


def test_the_limits_leave_the_render_thread_clean() -> None:
    with pytest.raises(TemplateLimitError):
        ChatTemplate("{{ 'x' * 1000000000 }}").render([Message("user", "x")])
    assert ChatTemplate(CHATML).render([Message("user", "Hi")]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
