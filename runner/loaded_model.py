"""A model made ready to generate: file resolved and checked, memory planned, engine built."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from runner.chat_template import ChatTemplate, Message
from runner.engine import Engine
from runner.gguf_file import GgufInfo, read_gguf
from runner.llama import ContextShape, Model
from runner.memory_plan import MemoryPlan
from runner.model_runner import ModelRunner
from runner.options import EngineOptions
from runner.scheduler import Scheduler
from runner.store import ModelStore


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


class LoadedModel:
    """Owns the Model and the ModelRunner (free order: runner's context, then the model)."""

    def __init__(
        self,
        model: str | Path,
        options: EngineOptions | None = None,
        store: ModelStore | None = None,
        log: Callable[[str], None] = _stderr,
    ) -> None:
        self.options = options or EngineOptions()
        store = store or ModelStore()
        self.path, ref = store.resolve(str(model))
        self.name = ref.name if ref else self.path.stem
        self.info: GgufInfo = read_gguf(self.path)
        plan = MemoryPlan.for_model(self.info, self.options)
        plan.check()
        log(plan.describe())
        self.model = Model(self.path, self.options.n_gpu_layers)
        try:
            self.template = ChatTemplate.for_model(
                self.model.chat_template,
                self.model.token_text(self.model.bos_id) if self.model.bos_id >= 0 else "",
                self.model.token_text(self.model.eos_id) if self.model.eos_id >= 0 else "",
            )
            shape = ContextShape(
                n_seq=self.options.parallel,
                n_ctx_per_seq=self.options.ctx_size,
                n_batch=self.options.batch_size,
                n_threads=self.options.threads,
                kv_unified=False,  # one KV stream per slot: measured identical to single-sequence output
                kv_type=self.options.kv_type,
            )
            self.runner = ModelRunner(self.model, shape)
        except BaseException:
            self.model.close()
            raise
        scheduler = Scheduler(
            self.options.parallel, self.options.ctx_size, self.options.batch_size, self.options.max_queue, self.runner
        )
        self.engine = Engine(self.runner, scheduler, self.model)

    def chat_prompt_ids(self, messages: list[Message]) -> tuple[int, ...]:
        """Render the chat template and tokenize it (specials parsed; BOS added only if missing)."""
        text = self.template.render(messages)
        bos = self.template.bos_token
        add_special = not (bos and text.startswith(bos))
        return tuple(self.model.tokenize(text, add_special=add_special, parse_special=True))

    def text_prompt_ids(self, text: str) -> tuple[int, ...]:
        return tuple(self.model.tokenize(text, add_special=True, parse_special=False))

    def close(self) -> None:
        self.runner.close()
        self.model.close()
