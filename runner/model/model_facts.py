"""What the faces may ask of a loaded model, and nothing more: vocabulary bounds, token bytes, the
template's stop strings and tool syntax, and the one check that a prompt fits a slot.

The server reads a model only through this object (not through `loaded.model` or
`loaded.template`), so that what it depends on stays small and the engine's objects stay the
engine thread's."""

from __future__ import annotations

from runner.core.errors import InputError
from runner.prompt.chat_template import ChatTemplate
from runner.prompt.tools import HERMES, syntax_of
from runner.runtime.gguf_file import GgufInfo
from runner.runtime.llama import Model
from runner.scheduler.scheduler import PromptTooLongError, check_prompt_length


class TokenIdError(InputError):
    """A token id outside the model's vocabulary."""


class ModelFacts:
    def __init__(self, model: Model, template: ChatTemplate, ctx_size: int, n_slots: int,
                 default_max_tokens: int, gguf: GgufInfo | None = None, memory_bytes: int = 0,
                 placement: dict[str, object] | None = None, inputs: tuple[str, ...] = ("text",)) -> None:
        self._model = model
        self.inputs = inputs  # what a prompt may hold: text, and image or audio where a projector takes them
        self.gguf = gguf  # the file's header (what Ollama's API describes a model by)
        self.memory_bytes = memory_bytes  # its memory plan's total
        self.placement = placement or {}  # where its layers are (gpu_fit.Offload.as_json)
        self.n_vocab = model.n_vocab
        self.n_embd = model.n_embd
        self.ctx_size = ctx_size  # tokens per slot
        self.n_slots = n_slots
        self.default_max_tokens = default_max_tokens
        self.stop = template.stop  # the template's own stop strings (chat replies)
        self.tool_syntax = syntax_of(template.source) if template.knows_tools else HERMES
        self.fills_in_the_middle = model.fim_ids is not None  # a code model with the tags (prompt/infill.py)

    @property
    def only_embeds(self) -> bool:
        """An embedding model (its GGUF names a pooling type, as Ollama tells them): it embeds, and
        what it would write is no reply."""
        return self.gguf is not None and self.gguf.arch_value("pooling_type") is not None

    def check_writes(self) -> None:
        """Refuse a reply from an embedding model (InputError)."""
        if self.only_embeds:
            raise InputError("this is an embedding model (its GGUF names a pooling type): it embeds texts and "
                             "writes no replies; send the texts to /v1/embeddings, /api/embed or `runner embed`")

    @property
    def takes_images(self) -> bool:
        return "image" in self.inputs

    @property
    def takes_audio(self) -> bool:
        return "audio" in self.inputs

    def token_bytes(self, token_id: int) -> bytes:
        return self._model.token_bytes(token_id)

    def prompt_token_bytes(self, token_id: int) -> bytes:
        """A prompt token as its writer wrote it: a control token ('<|im_start|>') by its text, which
        a reply's rendering leaves out (a plain prompt's control tokens are parsed from their text)."""
        return self._model.token_bytes(token_id) or self._model.token_text(token_id).encode()

    def detokenize(self, token_ids: list[int]) -> str:
        return self._model.detokenize(token_ids)

    def single_token_id(self, text: str) -> int | None:
        """The id of the one token that spells `text` (a special tag such as <think>), if there is one."""
        ids = self._model.tokenize(text, add_special=False, parse_special=True)
        return ids[0] if len(ids) == 1 and self._model.token_bytes(ids[0]) == text.encode() else None

    @property
    def max_text_chars(self) -> int:
        """The most characters check_text_fits lets through: every token stands for at most
        max_token_bytes bytes, and a character is at least one."""
        return self.ctx_size * self._model.max_token_bytes - 1

    def check_text_fits(self, n_chars: int) -> None:
        """Refuse, before tokenizing, text that cannot fit a slot (max_text_chars)."""
        n_min_tokens = n_chars // self._model.max_token_bytes
        if n_chars > self.max_text_chars:
            raise PromptTooLongError(f"the prompt has {n_chars} characters, at least {n_min_tokens} tokens, but a "
                                     f"slot's context holds {self.ctx_size}; raise --ctx-size or shorten it",
                                     n_min_tokens, self.ctx_size - 1)

    def check_token_ids(self, token_ids: tuple[int, ...] | list[int]) -> None:
        if any(t < 0 or t >= self.n_vocab for t in token_ids):
            raise TokenIdError(f"token ids must be in [0, {self.n_vocab})")

    def check_prompt(self, n_prompt: int) -> None:
        """A prompt no slot can hold (or an empty one) is refused here, once, before it is queued."""
        check_prompt_length(n_prompt, self.ctx_size)

    def room_after(self, n_prompt: int) -> int:
        """Tokens a reply can take after a prompt this long."""
        return self.ctx_size - n_prompt
