"""A model made ready to generate: file resolved and checked, memory planned, engine built."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runner.catalog.catalog import ModelRef
from runner.catalog.hub import parse_hub_ref
from runner.catalog.store import ModelStore
from runner.core.errors import ModelLoadError, OptionError
from runner.config.options import EngineOptions, flash_attention, micro_batch_max
from runner.model.model_facts import ModelFacts
from runner.prompt.chat_template import (
    IMAGE_MARK,
    ChatTemplate,
    Message,
    TemplateError,
    TemplateLimitError,
)
from runner.prompt.infill import FimTokens, fill_in_the_middle
from runner.prompt.tools import Tool
from runner.runtime.calibration import measure
from runner.runtime.calibration_cache import agreement_key, cached_json, calibration_key, vocabulary_key
from runner.runtime.devices import Device
from runner.runtime.draft_agreement import AGREEMENT_TEXT, measure_agreement
from runner.runtime.embeddings import Embedder
from runner.runtime.gguf_file import GgufInfo, read_gguf
from runner.runtime.layer_split import device_shares, parse_tensor_split
from runner.runtime.rpc_address import parse_workers
from runner.runtime.gpu_fit import parse_gpu_layers, plan_offload
from runner.runtime.llama import Context, ContextShape, Model, has_rpc_devices, in_scratch_thread, list_devices
from runner.runtime.memory_plan import MemoryPlan, draft_options, layer_costs
from runner.runtime.model_runner import ModelRunner
from runner.sampling.constraints import Constraint, GrammarSpec, compile_constraint
from runner.scheduler.engine import Engine
from runner.scheduler.request import MediaSpan, media_placeholder
from runner.scheduler.scheduler import Scheduler
from runner.runtime import staging
from runner.speculation import eagle3_drafter, model_drafter, mtp_drafter, ngram_drafter  # noqa: F401  (register the built-in drafters)
from runner.speculation.eagle3_drafter import is_eagle3_head
from runner.speculation.fed_drafter import FedDrafter
from runner.speculation.mtp_drafter import MTP_BY_DEFAULT
from runner.speculation.target_rows import ROW_BYTES
from runner.speculation.cost_model import ShapeCosts, StepCosts
from runner.speculation.drafter import Drafter, make_drafter
from runner.speculation.model_drafter import check_same_vocab_header
from runner.speculation.ngram_store import NgramStore
from runner.speculation.speculator import PRIOR_ACCEPT, SpecMode, Speculator

if TYPE_CHECKING:
    from runner.runtime.llama import Model as LlamaModel
    from runner.runtime.mtmd import ImageChunk, Projector

CONTENT_MARK = "\ue000"  # a private-use character around content placeholders (see chat_prompt_ids)


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
        devices: list[Device] | None = None,
    ) -> None:
        """`devices`: what llama.cpp sees, unless given (tests give made-up GPUs)."""
        self.options = options or EngineOptions()
        store = store or ModelStore()
        self.path, ref = store.resolve(str(model))
        self.source = str(model)  # as given: a path, a catalog name or a Hub reference
        # the served name: the catalog's, a Hub reference as typed (as Ollama names them), else the file's
        self.name = ref.name if ref else str(model) if parse_hub_ref(str(model)) else self.path.stem
        self.info: GgufInfo = read_gguf(self.path)
        _check_not_a_companion(self.info)
        workers = self._rpc_workers()
        self.devices = (list_devices() if devices is None else devices) + workers
        split = parse_tensor_split(self.options.tensor_split, len(workers)) if workers else None
        if self.options.tensor_split and not workers:
            raise OptionError("--tensor-split shares the layers between this machine and --rpc workers: add --rpc")
        costs = layer_costs(self.info, self.options)
        wanted = split.n_gpu_layers(costs.n_layer) if split else parse_gpu_layers(self.options.n_gpu_layers)
        self.offload = plan_offload(wanted, costs, self.devices)
        # --mmproj, else the projector a Hub model's repo provides (a vision model: pulled with it)
        self.mmproj_path = store.resolve(self.options.mmproj)[0] if self.options.mmproj else store.projector_of(str(model))
        if self.mmproj_path is not None:
            _check_takes_media(self.info)
        if self.mmproj_path is not None and not self.options.mmproj:
            log(f"vision projector: {self.mmproj_path.name} (from the model's Hub repository)")
        # the files it runs on (a split's parts, its projector, its draft's): not to be deleted under it
        self.files: list[Path] = [*self.info.part_paths, *([self.mmproj_path] if self.mmproj_path else [])]
        self.memory_plan = MemoryPlan.for_model(self.info, self.options, offload=self.offload)
        if self.mmproj_path is not None:  # the projector's weights and the encoded images it keeps
            self.memory_plan = dataclasses.replace(
                self.memory_plan, weights_bytes=self.memory_plan.weights_bytes + read_gguf(self.mmproj_path).weights_bytes
                + self.options.media_cache_mb * 2**20)
        self.memory_plan.check()
        log(self.memory_plan.describe())
        n_trained = self.info.n_ctx_train
        if n_trained and self.options.ctx_size > n_trained:  # (llama.cpp takes it; the model was never taught it)
            log(f"warning: --ctx-size {self.options.ctx_size} is more than {self.path.name} was trained for "
                f"({n_trained} tokens): past that, its replies may fall apart")
        by_llama_order = workers + [d for d in self.offload.devices if d not in workers]  # (llama.cpp's: RPC first)
        # named where this process has workers registered: this model's, never another model's
        self.layer_devices = [d.name for d in by_llama_order] if workers or has_rpc_devices() else None
        if workers:  # where each layer goes, worker by worker, before the weights are sent
            shares = list(split.devices) + [0.0] * (len(by_llama_order) - len(workers)) if split else None
            for share in device_shares(costs, self.offload.n_gpu_layers, by_llama_order, shares,
                                       self.info.embedding_bytes):
                log(f"  {share.describe()}")
        self.uses_mtp = self._wants_mtp(store, ref, log)
        self.model = Model(self.path, self.offload.n_gpu_layers, split.devices if split else (), self.layer_devices,
                           load_mtp=self.uses_mtp)
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
                flash_attn=flash_attention(self.options),
                n_ubatch_max=micro_batch_max(self.options),
                # off: sliding-window layers keep only their window (gemma-3-270m's 15 at 32k: ~15 MiB,
                # not 480, and a long prompt's steps attend that, not the whole context); a prefix
                # cached past it is continued from a checkpoint or computed again
                # (Scheduler._place asks ModelRunner.usable_prefix)
                swa_full=self.options.swa_full == "on",
            )
            self.runner = ModelRunner(self.model, shape, may_pad=self.options.batch_invariant == "on")
            self.projector = self._projector()
            self.facts = ModelFacts(self.model, self.template, self.options.ctx_size, self.options.parallel,
                                    self.options.max_tokens, self.info, self.memory_plan.total_bytes,
                                    self.offload.as_json(), self._inputs())
        except BaseException:
            self.model.close()
            raise
        scheduler = Scheduler(
            self.options.parallel, self.options.ctx_size, self.options.batch_size, self.options.max_queue, self.runner
        )
        try:
            # a drafter's own context keeps its sliding-window layers whole: it reuses its common
            # prefix with the target's tokens without asking whether the window still holds it
            self.speculator = self._speculator(store, ref, dataclasses.replace(shape, swa_full=True), log)
        except BaseException:
            self.runner.close()
            self.model.close()
            raise
        self.engine = Engine(self.runner, scheduler, self.model, self.speculator,
                             jump_forward=self.options.jump_forward == "on")
        self._embedder: Embedder | None = None
        self._embedder_lock = threading.Lock()
        self._cache_dir = store.writable_root()

    def _rpc_workers(self) -> list[Device]:
        """--rpc's workers, each checked and registered with llama.cpp (RpcError: one that cannot be used)."""
        if not self.options.rpc:
            return []
        from runner.runtime import rpc  # (ggml-rpc is looked up only for a model placed on workers)

        return rpc.add_workers(parse_workers(self.options.rpc))

    def _projector(self) -> Projector | None:
        """The model's mmproj, loaded beside it; its images decode through the runner."""
        if self.mmproj_path is None:
            return None
        from runner.runtime.image_decoder import ImageDecoder  # (libmtmd is loaded only for a projector)
        from runner.runtime.mtmd import Projector

        projector = Projector(self.mmproj_path, self.model, self.options.threads,
                              use_gpu=self.offload.n_gpu_layers != 0 and any(  # (never an RPC worker)
                                  not d.name.startswith("RPC") for d in self.offload.devices))
        self.runner.images = ImageDecoder(projector, self.options.media_cache_mb * 2**20)
        return projector

    def _inputs(self) -> tuple[str, ...]:
        p = self.projector
        return ("text",) + (("image",) if p and p.takes_images else ()) + (("audio",) if p and p.takes_audio else ())

    def media_chunks(self, data: bytes, kind: str | None = None) -> tuple[ImageChunk, ...]:
        """An image (or an audio clip: `kind` 'audio', None for either) as its prompt spans (a clip
        one per window, a tiling projector's image one per tile), encoded on the caller's thread
        (the engine's steps go on meanwhile); MediaError when the projector cannot read it or takes
        no such input."""
        return self.encoded(self.media_spans(data, kind))

    def media_spans(self, data: bytes, kind: str | None = None) -> tuple[ImageChunk, ...]:
        """media_chunks before encoding: what they cost in positions is known, no encoder has run."""
        assert self.projector is not None
        return self.projector.chunks(data, kind)

    def encoded(self, chunks: tuple[ImageChunk, ...]) -> tuple[ImageChunk, ...]:
        """The chunks with their embeddings (from the media cache, else the encoder)."""
        assert self.runner.images is not None
        return tuple(self.runner.images.ready(chunk) for chunk in chunks)

    def _wants_mtp(self, store: ModelStore, ref: ModelRef | None, log: Callable[[str], None]) -> bool:
        """Draft with the model's own MTP layers? With --spec mtp (refused with one line where the
        file has none or llama.cpp lacks the calls), and by default where the file has them and no
        other drafter is named."""
        opts, n_mtp = self.options, self.info.arch_int("nextn_predict_layers", 0)
        if opts.spec == "mtp":
            if opts.draft:
                raise OptionError(f"--spec mtp drafts with the model's own MTP layers: leave out --draft {opts.draft}")
            if not n_mtp:
                raise OptionError(f"--spec mtp: {self.path.name} has no MTP layers (its GGUF sets no "
                                  f"{self.info.architecture}.nextn_predict_layers)")
            staging.require(staging.MTP_CALLS, "--spec mtp")
            return True
        if not n_mtp or opts.spec in ("off", "eagle3") or opts.draft or (ref and ref.entry.draft):
            return False
        if self.info.architecture not in MTP_BY_DEFAULT:  # (no MTP graph here, or a recurrent state)
            return False
        if staging.missing(staging.MTP_CALLS):
            log(f"{self.path.name} has MTP layers, but this llama.cpp lacks the calls to draft with them: "
                "no MTP drafting")
            return False
        return True

    def _speculator(self, store: ModelStore, ref: ModelRef | None, shape: ContextShape,
                    log: Callable[[str], None]) -> Speculator | None:
        """The drafter named by --draft (or the catalog's pairing when --spec asks for one), the
        model's own MTP layers, or the EAGLE3 head its Hub repository publishes."""
        opts = self.options
        forced = opts.spec in ("on", "mtp", "eagle3") or bool(opts.draft)  # (else a failure only means no drafting)
        draft = opts.draft or (ref.entry.draft if ref and opts.spec in ("auto", "on") else "")
        draft = "mtp" if self.uses_mtp else draft or self._hub_head(store, log)
        if opts.spec == "eagle3" and draft == "ngram":
            raise OptionError("--spec eagle3 drafts with an EAGLE3 head: --draft ngram is not one "
                              "(name the head's GGUF)")
        if opts.spec == "eagle3" and not draft:
            raise OptionError("--spec eagle3 drafts with an EAGLE3 head: name it with --draft FILE (a GGUF of "
                              "architecture eagle3)")
        if opts.spec == "on" and not draft:  # (it was quietly no drafting at all)
            raise OptionError(f"--spec on drafts every step: name a drafter with --draft (a draft model, or ngram); "
                              f"{self.path.name} has no draft of its own (a catalog pairing, MTP layers, a "
                              "published EAGLE3 head)")
        mode = SpecMode.ON if opts.spec in ("on", "mtp", "eagle3") else SpecMode(opts.spec or ("auto" if draft else "off"))
        if not draft or mode is SpecMode.OFF:
            return None
        if self.model.keeps_recurrent_state:  # (whatever drafts: a rejected draft would stay in its state)
            why = (f"{self.path.name} ({self.info.architecture}) keeps a recurrent state, which runner cannot roll "
                   "back past a rejected draft (llama.cpp's n_rs_seq snapshots are not used yet)")
            if forced:
                raise ModelLoadError(f"--spec {opts.spec}: {why}" if opts.spec in ("on", "mtp", "eagle3")
                                     else f"--draft {opts.draft}: {why}")
            log(f"{why}: no speculative decoding")
            return None
        target_costs = self._costs(store, self.path, self.runner.context, log) if mode is SpecMode.AUTO else None
        try:
            drafter, draft_path = self._drafter(store, draft, shape, log)
            self.files += [draft_path] if draft_path is not None else []
        except (ModelLoadError, RuntimeError) as exc:
            if forced or draft == "ngram":
                raise
            log(f"no speculative decoding: {exc}")  # (a default drafter that cannot run here)
            return None
        try:
            draft_costs, prior = None, PRIOR_ACCEPT
            if target_costs and draft_path is not None:
                draft_costs = self._costs(store, draft_path, drafter.context, log, part="mtp" if self.uses_mtp else "")
                prior = (self._fed_agreement(store, draft_path, drafter, log) if isinstance(drafter, FedDrafter)
                         else self._agreement(store, draft_path, drafter.context, log))
            costs = StepCosts(target_costs, draft_costs, shape.n_ubatch, self.runner.pads_batches) if target_costs else None
            log(f"speculative decoding: {drafter.name}, --spec {opts.spec or mode.value}, up to {opts.draft_max} tokens")
            return Speculator(drafter, mode, opts.draft_max, opts.parallel, costs, prior)
        except BaseException:
            drafter.close()
            raise

    def _hub_head(self, store: ModelStore, log: Callable[[str], None]) -> str:
        """The EAGLE3 head a Hub model's repository publishes beside it (where this llama.cpp can run one)."""
        if self.options.spec not in ("", "auto", "on", "eagle3"):
            return ""
        head = store.eagle3_head_of(self.source)
        if head is None or (self.options.spec != "eagle3" and staging.missing(staging.EAGLE3_CALLS)):
            return ""
        log(f"EAGLE3 head: {head.name} (from the model's Hub repository)")
        return str(head)

    def _drafter(self, store: ModelStore, draft: str, shape: ContextShape,
                 log: Callable[[str], None]) -> tuple[Drafter, Path | None]:
        """The drafter, and the file whose costs and agreement auto measures (None: n-gram)."""
        opts = self.options
        if self.uses_mtp:
            self._check_rows_fit(self.model.n_embd_out, "MTP")
            log(f"MTP drafting: the model's own {self.model.n_layer_nextn} MTP layer(s), fed every decode's hidden rows")
            return make_drafter("mtp", target=self.runner, shape=shape), self.path
        if draft == "ngram":
            ngrams = NgramStore(opts.ngram_store_mb << 20) if opts.ngram_store_mb > 0 else None
            if ngrams is not None:
                log(f"n-gram store: {ngrams.n_bytes / (1 << 20):.0f} MiB ({ngrams.n_entries:,} n-grams), learned from "
                    "every request's replies, shared by all slots, kept in this process only")
            return make_drafter("ngram", store=ngrams), None
        draft_path, draft_ref = store.resolve(draft)
        draft_info = read_gguf(draft_path)
        if draft_info.architecture == PROJECTOR_ARCH:
            raise OptionError(f"--draft: {draft_path.name} is a projector (mmproj), not a draft model: give it as "
                              "--mmproj")
        is_head = is_eagle3_head(draft_info.architecture)
        if opts.spec == "eagle3" and not is_head:
            raise OptionError(f"--spec eagle3: {draft_path.name} is a {draft_info.architecture} model, "
                              "not an EAGLE3 head (GGUF architecture eagle3)")
        if is_head:
            staging.require(staging.EAGLE3_CALLS, "an EAGLE3 head")
            self._check_rows_fit(3 * self.model.n_embd, "EAGLE3")
        check_same_vocab_header(self.info, draft_info)
        draft_offload = plan_offload(parse_gpu_layers(opts.n_gpu_layers), layer_costs(draft_info, draft_options(opts)),
                                     self.devices, reserved=self.offload.gpu_bytes)
        both = self.memory_plan.with_draft(MemoryPlan.for_draft(draft_info, opts, offload=draft_offload))
        both.check()
        kind = "EAGLE3 head" if is_head else "draft model"
        log(f"{kind}: {draft_ref.name if draft_ref else draft_path.stem} ({draft_path.name}); with it, {both.describe()}")
        draft_model = Model(draft_path, draft_offload.n_gpu_layers, devices=self.layer_devices)
        try:
            if is_head:  # (the head reads the target's layer inputs: it drafts for this runner's context)
                return make_drafter("eagle3", target=self.runner, model=draft_model, shape=shape), draft_path
            return make_drafter("draft-model", model=draft_model, target=self.model, shape=shape), draft_path
        except BaseException:
            draft_model.close()
            raise

    def _check_rows_fit(self, width: int, kind: str) -> None:
        """The target rows an MTP or EAGLE3 drafter keeps (F16, a row per slot and position) are
        planned with the rest."""
        rows = ROW_BYTES * width * self.options.ctx_size * self.options.parallel
        self.memory_plan = dataclasses.replace(self.memory_plan, weights_bytes=self.memory_plan.weights_bytes + rows)
        self.memory_plan.check()

    def _costs(self, store: ModelStore, path: Path, context: Context, log: Callable[[str], None],
               part: str = "") -> ShapeCosts:
        opts, shape = self.options, context.shape
        key = calibration_key(path, opts.threads, self.offload.n_gpu_layers, shape.n_seq, shape.n_ubatch,
                              f"{opts.rpc}/{opts.tensor_split}" if opts.rpc else "", part)

        def calibrate() -> dict:
            what = f"{path.name}'s {part.upper()} layers" if part else path.name  # (MTP: the same file again)
            log(f"measuring decode costs of {what} for --spec auto (once per model and machine)")
            return in_scratch_thread(lambda: measure(context))

        return ShapeCosts.from_json(cached_json(store.writable_root(), key, calibrate))

    def _agreement(self, store: ModelStore, draft_path: Path, draft_context: Context,
                   log: Callable[[str], None]) -> float:
        """How often the draft's top token is the target's (auto's starting acceptance), cached per pair."""
        def measure_pair() -> float | None:
            log(f"measuring how often {draft_path.name} agrees with {self.path.name} (once per pair)")
            return in_scratch_thread(lambda: measure_agreement(self.runner.context, draft_context))

        agreement = cached_json(store.writable_root(), agreement_key(self.path, draft_path), measure_pair)
        return PRIOR_ACCEPT if agreement is None else agreement

    def _fed_agreement(self, store: ModelStore, draft_path: Path, drafter: FedDrafter,
                       log: Callable[[str], None]) -> float:
        """How often an MTP or EAGLE3 drafter's top token is the target's on a fixed text, fed the
        target's rows as it is when drafting (cached per pair; for MTP the pair is the file and itself)."""
        def measure_pair() -> float | None:
            log(f"measuring how often {drafter.name} drafting agrees with {self.path.name} (once per model)")
            tokens = self.model.tokenize(AGREEMENT_TEXT, add_special=True, parse_special=False)
            return in_scratch_thread(lambda: drafter.measure_agreement(tokens))

        agreement = cached_json(store.writable_root(), f"{agreement_key(self.path, draft_path)}:{drafter.name}", measure_pair)
        return PRIOR_ACCEPT if agreement is None else agreement

    def compile_constraint(self, spec: GrammarSpec) -> Constraint:
        """A fresh grammar state for one request (ConstraintError if the schema or grammar cannot compile)."""
        return compile_constraint(spec, self.model.guidance_tokenizer, self.model.n_vocab)

    def warm_up(self) -> None:
        """What a first request would otherwise wait for: the vocabulary scan behind
        facts.check_text_fits, the template's first render (and the server's worker thread that runs this).
        The scan's result is kept with the calibrations: a model loaded again skips it."""
        self.model.knows_max_token_bytes(cached_json(self._cache_dir, vocabulary_key(self.path),
                                                     lambda: self.model.max_token_bytes))
        self.facts.check_text_fits(0)
        with contextlib.suppress(TemplateError, TemplateLimitError):  # (such a template answers requests the same)
            self.chat_prompt_ids([Message("user", "warm-up")])

    def chat_prompt_ids(self, messages: list[Message], tools: list[Tool] | None = None) -> tuple[int, ...]:
        """Render the chat template and tokenize it (specials parsed; BOS added only if missing).

        Only the template's own text may produce special tokens: a message that spells one (a
        user typing '<|im_end|>' to forge a turn) has its content tokenized as plain text. A last
        message of the assistant's is continued, not answered (a prefill)."""
        return self.chat_prompt(messages, tools)[0]

    def chat_prompt(self, messages: list[Message], tools: list[Tool] | None = None,
                    images: Sequence[Sequence[ImageChunk]] = ()) -> tuple[tuple[int, ...], tuple[MediaSpan, ...]]:
        """chat_prompt_ids with images (each one's chunks, media_chunks): each IMAGE_MARK in the
        contents becomes the next image's spans (placeholder ids; the spans say where). TemplateError
        if the marks and images disagree."""
        prompt = PromptWithImages(self.model, images)
        last = messages[-1] if messages else None
        # a conversation that ends with the assistant's words is continued from them (a prefill, as
        # Anthropic's API and llama.cpp's server take it): its turn opened, its words after, unclosed
        is_prefill = last is not None and last.role == "assistant" and bool(last.content) and not last.tool_calls
        prefill = last if is_prefill else None
        turns = messages[:-1] if prefill is not None else messages
        if any(s in m.content for m in turns for s in self.model.special_texts):
            self._chat_prompt_ids_with_plain_contents(turns, tools, prompt)
        else:
            text = self.template.render(turns, tools=tools)
            prompt.add(text, add_special=self._adds_bos(text), parse_special=True)
        if prefill is not None:
            prompt.add(prefill.content, add_special=False, parse_special=False)
        return prompt.finish()

    def _adds_bos(self, text: str) -> bool:
        bos = self.template.bos_token
        return not (bos and text.startswith(bos))

    def _chat_prompt_ids_with_plain_contents(self, messages: list[Message], tools: list[Tool] | None,
                                             prompt: PromptWithImages) -> None:
        """The template rendered around placeholders; its text parsed for specials, contents not.

        NOTE: a template that rewrites contents (strip, split) sees the placeholders instead."""
        marked = self.template.render([dataclasses.replace(m, content=f"{CONTENT_MARK}{i}{CONTENT_MARK}")
                                       for i, m in enumerate(messages)], tools=tools)
        parts = marked.split(CONTENT_MARK)  # template text, content index, template text, ...
        prompt.add("", add_special=self._adds_bos(marked), parse_special=True)  # BOS, if any
        for j, part in enumerate(parts):
            if j % 2:
                prompt.add(messages[int(part)].content, add_special=False, parse_special=False)
            elif part:
                prompt.add(part, add_special=False, parse_special=True)

    def text_prompt_ids(self, text: str) -> tuple[int, ...]:
        """A plain prompt's ids (a completion's, Ollama's raw or templated one, `runner run --raw`):
        its writer wrote any control token in it, as llama.cpp's server and Ollama read them, so
        '<|im_start|>' is the model's token, not its letters. An empty one is the start of a document,
        as OpenAI reads it: the model's BOS token (or its EOS, where it has none)."""
        ids = tuple(self.model.tokenize(text, add_special=self._adds_bos(text), parse_special=True))
        start = self.model.bos_id if self.model.bos_id >= 0 else self.model.eos_id
        return ids if ids or text or start < 0 else (start,)

    def infill_prompt_ids(self, prefix: str | tuple[int, ...], suffix: str) -> tuple[int, ...]:
        """The fill-in-the-middle prompt for the text between prefix (text, or token ids) and suffix
        (the model has the tags: ModelFacts.fills_in_the_middle)."""
        assert self.model.fim_ids is not None
        prefix_ids = prefix if isinstance(prefix, tuple) else self.model.tokenize(prefix, add_special=False,
                                                                                            parse_special=False)
        return fill_in_the_middle(FimTokens(*self.model.fim_ids), prefix_ids,
                                  self.model.tokenize(suffix, add_special=False, parse_special=False),
                                  self.model.bos_id if self.model.add_bos else None)

    def embedder(self) -> Embedder:
        """The embedding context, made on first use (its KV costs as much as a slot's): its own
        llama.cpp context on the same weights, so embeddings never wait behind generation."""
        with self._embedder_lock:
            if self._embedder is None:
                n_ctx = min(self.options.ctx_size, self.model.n_ctx_train or self.options.ctx_size)
                self._embedder = Embedder(self.model, n_ctx, self.options.threads)
            return self._embedder

    def embedding_ids(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_special=True, parse_special=False)

    def set_threads(self, n_threads: int) -> None:
        """The decode threads of the model's contexts and its draft's (call on the engine thread; the
        embedding context keeps its own)."""
        self.runner.context.set_threads(n_threads)
        draft_context = getattr(self.speculator.drafter, "context", None) if self.speculator else None
        if draft_context is not None:
            draft_context.set_threads(n_threads)

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()
        if self._embedder is not None:
            self._embedder.close()
        if self.speculator is not None:
            self.speculator.drafter.close()  # the draft before the target
        self.runner.close()
        self.model.close()


# architectures whose graph aborts the process (GGML_ABORT, not an error) on embeddings input unless
# the GGUF has M-RoPE sections: a text-only conversion paired with a projector
EMBEDDINGS_NEED_MROPE = frozenset({"glm4", "glm4moe"})
PROJECTOR_ARCH = "clip"  # (the GGUF architecture of every libmtmd projector, vision or audio)


def _check_takes_media(info: GgufInfo) -> None:
    """Refused at load, not by the process's abort at the first image (EMBEDDINGS_NEED_MROPE)."""
    arch = info.architecture
    sections = tuple(info.arch_value("rope.dimension_sections") or ()) + (0, 0)
    if arch in EMBEDDINGS_NEED_MROPE and not (sections[0] > 0 and sections[1] > 0):  # (llama.cpp's use_mrope)
        raise ModelLoadError(f"{info.path.name} ({arch}) was converted without M-RoPE sections: llama.cpp aborts "
                             "decoding an image or clip into it, so it takes no projector; use a GGUF converted for vision")


def _check_not_a_companion(info: GgufInfo) -> None:
    """A projector or an EAGLE3 head goes beside a model, not in its place: one line saying where."""
    if info.architecture == PROJECTOR_ARCH:
        raise ModelLoadError(f"{info.path.name} is a projector (mmproj), not a model: give it as --mmproj beside "
                             "the model it belongs to")
    if is_eagle3_head(info.architecture):
        raise ModelLoadError(f"{info.path.name} is an EAGLE3 head, which drafts for another model: give it as "
                             "--draft beside its target")


class PromptWithImages:
    """Token ids built piece by piece; each image mark in a piece (`image_mark(i)`) is image i's spans."""

    def __init__(self, model: LlamaModel, images: Sequence[Sequence[ImageChunk]]) -> None:
        self._model = model
        self._images = list(images)
        self._ids: list[int] = []
        self._spans: list[MediaSpan] = []
        self._placed: set[int] = set()

    def add(self, text: str, add_special: bool, parse_special: bool) -> None:
        pieces = text.split(IMAGE_MARK) if self._images else [text]  # text, image index, text, ...
        if len(pieces) % 2 == 0:
            raise TemplateError("a message holds a stray image mark (U+E001)")
        for i, piece in enumerate(pieces):
            if i % 2:
                self._add_image(piece)
            elif piece or (i == 0 and add_special):
                self._ids += self._model.tokenize(piece, add_special=add_special and i == 0,
                                                  parse_special=parse_special)

    def _add_image(self, index_text: str) -> None:
        index = int(index_text) if index_text.isdigit() else -1
        if not 0 <= index < len(self._images) or index in self._placed:
            raise TemplateError("a message holds a stray image mark (U+E001)")
        self._placed.add(index)
        for chunk in self._images[index]:
            self._ids += chunk.before
            self._spans.append(MediaSpan(len(self._ids), chunk.n_tokens, chunk.key, chunk))
            self._ids += [media_placeholder(chunk.key)] * chunk.n_tokens
            self._ids += chunk.after

    def finish(self) -> tuple[tuple[int, ...], tuple[MediaSpan, ...]]:
        if len(self._placed) != len(self._images):
            raise TemplateError(f"the chat template kept {len(self._placed)} of the request's {len(self._images)} "
                                "images")
        if self._spans and self._spans[-1].end >= len(self._ids):
            raise TemplateError("the prompt may not end with an image: text must follow it")
        return tuple(self._ids), tuple(self._spans)
