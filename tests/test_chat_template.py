import pytest

from runner.chat_template import FALLBACK_STOP, ChatTemplate, Message, TemplateError

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
