"""The one module that imports llama_cpp: model, context, batch, vocab, KV ops, quantize.

Everything above this module speaks plain Python and numpy.
Free order (written once): context before model; a draft's objects before the target's.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp as _lc
import numpy as np

from runner.core.errors import ModelLoadError
from runner.config.options import N_UBATCH_MAX
from runner.runtime import staging
from runner.runtime.devices import KINDS, Device

T = TypeVar("T")

_LOG_LEVEL_ERROR = 3
_LOG_LEVEL_CONT = 5
_recent_log: collections.deque[str] = collections.deque(maxlen=40)
_backend_lock = threading.Lock()
_backend_ready = False


# A Ctrl-C that Python raised inside one of the callbacks below, where ctypes would print and drop
# it: loading stops at the next progress call and the main thread raises it once llama.cpp returns.
_interrupted = threading.Event()


@_lc.llama_log_callback
def _log_to_ring(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty on stderr; keep its recent lines to explain a failure instead.
    try:
        line = text.decode("utf-8", "replace")
        _recent_log.append(line)
        if level == _LOG_LEVEL_ERROR and (_show_errors or os.environ.get("RUNNER_LLAMA_LOG")):
            print(line, end="", flush=True)
        elif os.environ.get("RUNNER_LLAMA_LOG") == "all" and level != _LOG_LEVEL_CONT:
            print(line, end="", flush=True)
    except KeyboardInterrupt:
        _interrupted.set()


@_lc.llama_progress_callback
def _load_progress(_progress: float, _user_data: ctypes.c_void_p) -> bool:
    """Go on loading, unless a Ctrl-C has landed in a callback."""
    try:
        return not _interrupted.is_set()
    except KeyboardInterrupt:
        _interrupted.set()
        return False


def _raise_interrupt(free: Callable[[], None] | None = None) -> None:
    """Raise the Ctrl-C a callback caught (after `free`ing what the native call made), if one did."""
    if _interrupted.is_set():
        _interrupted.clear()
        if free is not None:
            free()
        raise KeyboardInterrupt


_show_errors = False


def show_errors() -> None:
    """From now on llama.cpp's (and ggml's) error lines are printed as well as kept (an RPC worker
    has no other way to say what went wrong with a head)."""
    global _show_errors
    _show_errors = True


def log_callback() -> Any:
    """The callback that keeps llama.cpp's lines in the ring (libmtmd's logs go there too)."""
    return _log_to_ring


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its log into a ring buffer."""
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        _lc.llama_log_set(_log_to_ring, ctypes.c_void_p(0))
        _lc.llama_backend_init()
        _backend_ready = True


EXTRA_BUFFERS_ENV = "RUNNER_EXTRA_BUFFERS"


def uses_extra_buffers(cpuinfo: str | None = None, env: str | None = None) -> bool:
    """llama.cpp's extra weight buffers (repacked layouts, Intel AMX tiles), except on a CPU with
    AMX: there the pinned llama.cpp's AMX matrix multiply crashed the first decode (SIGSEGV in
    ggml_backend_amx_mul_mat, on a Sapphire Rapids VM with a native build), and a crash cannot be
    caught. $RUNNER_EXTRA_BUFFERS=1 or 0 decides instead."""
    env = os.environ.get(EXTRA_BUFFERS_ENV) if env is None else env
    if env in ("0", "1"):
        return env == "1"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags = next((line.partition(":")[2].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "amx_tile" not in flags


def recent_log(n_lines: int = 8) -> str:
    """The last lines llama.cpp logged (errors from a failed load end up here)."""
    lines = [line.strip() for line in list(_recent_log)[-n_lines:] if line.strip()]
    return " | ".join(lines)


def library_version() -> str:
    return _lc.__version__


@functools.cache
def _ggml_devices_api() -> ctypes.CDLL:
    """ggml's device registry (exported by the ggml libraries libllama loads; not bound by llama_cpp)."""
    lib = _lc.llama_cpp._lib
    p = ctypes.c_void_p
    for name, restype, argtypes in (
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", p, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_type", ctypes.c_int, [p]),
        ("ggml_backend_dev_memory", None, [p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
        ("ggml_backend_dev_backend_reg", p, [p]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _device_handles(rpc: bool) -> dict[str, int]:
    """llama.cpp's device handles by name: the local ones, and with `rpc` the RPC workers registered
    in this process too (asking a worker anything, its memory included, aborts the process once the
    worker is gone: only a model placed on workers touches them)."""
    init_backend()
    lib = _ggml_devices_api()
    handles = {}
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if rpc or lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)) != b"RPC":
            handles[(lib.ggml_backend_dev_name(dev) or b"?").decode()] = dev
    return handles


def has_rpc_devices() -> bool:
    return len(_device_handles(rpc=True)) > len(_device_handles(rpc=False))


def list_devices(rpc: bool = False) -> list[Device]:
    """Every device this llama.cpp build registered (the CPU, then any GPU; with `rpc`, the RPC workers
    this process registered), with its free memory now."""
    lib = _ggml_devices_api()
    devices = []
    for dev in _device_handles(rpc).values():
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(dev)
        devices.append(Device((lib.ggml_backend_dev_name(dev) or b"?").decode(),
                              (lib.ggml_backend_dev_description(dev) or b"").decode(),
                              KINDS[kind] if 0 <= kind < len(KINDS) else f"type {kind}", free.value, total.value))
    return devices


# llama_get_logits returning the address as an int: llama_cpp's binding returns a float pointer, and
# turning that into an address (ctypes.cast) cost ~20 us a step, its code cold after every decode
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
    ctypes.cast(_lc.llama_cpp._lib.llama_get_logits, ctypes.c_void_p).value)

_has_decoded = threading.local()  # .team: this thread has decoded, so libgomp keeps a team for it


def in_scratch_thread(work: Callable[[], T]) -> T:
    """Run `work` (llama_decode calls made while loading) on a thread that ends right after.

    llama.cpp's CPU backend runs on OpenMP (libgomp), which keeps a team of worker threads per
    thread that ever decoded. With two teams alive on the same cores, libgomp stops spinning at
    barriers and every decode gets slower. A team ends with its thread, so decodes before the
    engine thread starts belong on a short-lived one; but a thread that already keeps a team (a
    program loading a second model after decoding) runs the work itself: a scratch thread's team
    beside it would skew --spec auto's calibration."""
    if getattr(_has_decoded, "team", False):
        return work()
    result: list[T] = []
    error: list[BaseException] = []

    finished = threading.Event()

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            error.append(exc)
        finally:
            finished.set()

    thread = threading.Thread(target=run, name="runner-load-decode")
    interrupt: KeyboardInterrupt | None = None
    try:
        thread.start()
    except KeyboardInterrupt as exc:  # (while start() waited for the thread to run)
        if thread.ident is None:
            raise
        interrupt = exc
    while not finished.is_set():  # a Ctrl-C waits for the work: it uses what the caller would then free
        try:  # (an Event: a join cut by Ctrl-C takes the thread for ended, on Python 3.11)
            finished.wait()
        except KeyboardInterrupt as exc:
            interrupt = exc
    thread.join()
    if interrupt is not None:
        raise interrupt
    if error:
        raise error[0]
    return result[0]


class Model:
    """Weights and vocabulary of one GGUF file."""

    def __init__(self, path: Path, n_gpu_layers: int = 0, tensor_split: Sequence[float] = (),
                 devices: Sequence[str] | None = None, load_mtp: bool = False) -> None:
        """`devices`: the layer devices by name, in order (None: llama.cpp's choice, every local GPU);
        `tensor_split`: each one's share of the layers (empty: by free memory); `load_mtp`: its
        multi-token-prediction layers too (llama.cpp skips them by default)."""
        init_backend()
        params = _lc.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.load_mtp = load_mtp
        if devices is not None:  # a NULL-terminated list
            handles = _device_handles(rpc=True)
            self._devices = (ctypes.c_void_p * (len(devices) + 1))(*(handles[name] for name in devices), None)
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if tensor_split:  # (llama.cpp copies the array while loading)
            shares = (ctypes.c_float * _lc.llama_max_devices())(*tensor_split)
            params.tensor_split = ctypes.cast(shares, ctypes.POINTER(ctypes.c_float))
        params.use_extra_bufts = uses_extra_buffers()
        _recent_log.clear()
        self.path = Path(path)
        params.progress_callback = _load_progress
        self._ptr = _lc.llama_model_load_from_file(str(path).encode(), params)
        _raise_interrupt(lambda: self._ptr and _lc.llama_model_free(self._ptr))
        if not self._ptr:
            raise ModelLoadError(f"llama.cpp could not load {path}: {recent_log(3) or 'unknown error'}")
        self._vocab = _lc.llama_model_get_vocab(self._ptr)
        self.n_vocab: int = _lc.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = _lc.llama_model_n_ctx_train(self._ptr)
        self.n_layer: int = _lc.llama_model_n_layer(self._ptr)
        self.n_embd: int = _lc.llama_model_n_embd(self._ptr)
        self.n_embd_out: int = _lc.llama_model_n_embd_out(self._ptr)  # a hidden row's width (MTP's input)
        self.n_layer_nextn: int = _lc.llama_model_n_layer_nextn(self._ptr)  # MTP layers in the file
        self.n_swa: int = _lc.llama_model_n_swa(self._ptr)  # a sliding-window layer's window (0: none)
        self.architecture = self.meta("general.architecture") or ""
        # a recurrent or hybrid model (Mamba, Qwen3.5, Qwen3-Next) keeps a state that removing KV
        # positions does not roll back
        self.keeps_recurrent_state = bool(_lc.llama_model_is_recurrent(self._ptr) or _lc.llama_model_is_hybrid(self._ptr))
        self.n_head: int = _lc.llama_model_n_head(self._ptr)
        self.n_head_kv: int = _lc.llama_model_n_head_kv(self._ptr)
        self.n_params: int = _lc.llama_model_n_params(self._ptr)
        self.size_bytes: int = _lc.llama_model_size(self._ptr)
        self.bos_id: int = _lc.llama_vocab_bos(self._vocab)
        self.eos_id: int = _lc.llama_vocab_eos(self._vocab)
        self.add_bos: bool = bool(_lc.llama_vocab_get_add_bos(self._vocab))
        fim = (_lc.llama_vocab_fim_pre(self._vocab), _lc.llama_vocab_fim_suf(self._vocab),
               _lc.llama_vocab_fim_mid(self._vocab))
        # a code model's fill-in-the-middle tags (prefix, suffix, middle); None where it has not all three
        self.fim_ids: tuple[int, int, int] | None = fim if all(t >= 0 for t in fim) else None
        self._eog_ids = frozenset(t for t in range(self.n_vocab) if _lc.llama_vocab_is_eog(self._vocab, t))
        self._piece_cache: dict[int, bytes] = {}

    # -- metadata -------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = _lc.llama_model_meta_val_str(self._ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            _lc.llama_model_meta_val_str(self._ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    @property
    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _lc.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    # -- vocabulary -----------------------------------------------------------------------
    @property
    def eog_ids(self) -> frozenset[int]:
        """End-of-generation tokens (eos, eot, <|im_end|>, ...)."""
        return self._eog_ids

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (_lc.llama_token * n_max)()
        n = _lc.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (_lc.llama_token * n_max)()
            n = _lc.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character); specials render empty."""
        piece = self._piece_cache.get(token_id)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = _lc.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = _lc.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._piece_cache[token_id] = piece
        return piece

    @functools.cached_property
    def special_texts(self) -> tuple[str, ...]:
        """Texts that become a control or user-defined token when specials are parsed (longest first)."""
        mask = _lc.LLAMA_TOKEN_ATTR_CONTROL | _lc.LLAMA_TOKEN_ATTR_USER_DEFINED
        texts = {self.token_text(t) for t in range(self.n_vocab) if _lc.llama_vocab_get_attr(self._vocab, t) & mask}
        return tuple(sorted(texts - {""}, key=len, reverse=True))

    @functools.cached_property
    def guidance_tokenizer(self) -> Any:
        """This vocabulary as an llguidance tokenizer (for constrained decoding; built once, ~1 s)."""
        import llguidance

        tokens = []
        for t in range(self.n_vocab):
            piece = self.token_bytes(t) or self.token_text(t).encode()
            attr = _lc.llama_vocab_get_attr(self._vocab, t)
            if attr & _lc.LLAMA_TOKEN_ATTR_CONTROL or (attr & _lc.LLAMA_TOKEN_ATTR_USER_DEFINED
                                                       and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + self.token_text(t).encode()  # llguidance's mark for a special token
            tokens.append(piece)
        tokenize = ctypes.cast(_lc.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        return llguidance.LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=self._vocab, tokenize_fptr=tokenize,
                                                    eos_token=sorted(self.eog_ids))

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes one token can stand for (as a piece or as its vocabulary text)."""
        return max(max(len(self.token_bytes(t)), len(self.token_text(t).encode())) for t in range(self.n_vocab))

    def knows_max_token_bytes(self, n_bytes: int) -> None:
        """max_token_bytes from an earlier scan of the same file (a scan takes 0.6 s for 262k tokens)."""
        self.__dict__["max_token_bytes"] = n_bytes

    def token_text(self, token_id: int) -> str:
        """The vocabulary's text for a token, specials included (e.g. '<|im_end|>')."""
        raw = _lc.llama_vocab_get_text(self._vocab, token_id)
        return raw.decode("utf-8", "replace") if raw else ""

    def detokenize(self, token_ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", "replace")

    def target_layer_ids(self) -> list[int]:
        """An EAGLE3 head's target layers: whose inputs it reads (staging calls)."""
        n = staging.call("llama_model_target_layer_ids_n", self._ptr)
        ids = staging.call("llama_model_target_layer_ids", self._ptr)
        return [int(ids[i]) for i in range(n)]

    def close(self) -> None:
        if self._ptr:
            _lc.llama_model_free(self._ptr)
            self._ptr = None




_FLASH_ATTN = {"auto": _lc.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": _lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": _lc.LLAMA_FLASH_ATTN_TYPE_DISABLED}


@dataclass(frozen=True)
class ContextShape:
    n_seq: int
    n_ctx_per_seq: int
    n_batch: int
    n_threads: int
    kv_unified: bool = True
    kv_type: str = "f16"
    flash_attn: str = "auto"  # auto (llama.cpp decides), on, off
    n_ubatch_max: int = N_UBATCH_MAX  # tokens per micro-batch (llama.cpp's n_ubatch), at most
    n_junk_max: int = 0  # tokens a batch may carry beyond n_batch: the junk tokens of batch padding
    # a sliding-window layer's KV as long as the context (llama.cpp's default), or only the window
    # and a micro-batch (as llama-server keeps it): a prefix cached past the window is then gone
    swa_full: bool = True

    @property
    def n_ubatch(self) -> int:
        return min(self.n_batch, self.n_ubatch_max)

    @property
    def n_batch_max(self) -> int:
        return self.n_batch + self.n_junk_max


class Batch:
    """A reusable llama_batch whose arrays are numpy buffers we own (filled by slice assignment).

    With `n_embd`, every token row carries an embedding row as well (an MTP or EAGLE3 draft
    context reads a token and a hidden row together)."""

    def __init__(self, n_tokens_max: int, n_embd: int = 0) -> None:
        self.n_tokens_max = n_tokens_max
        self.token_ids = np.zeros(n_tokens_max, dtype=np.int32)
        self.positions = np.zeros(n_tokens_max, dtype=np.int32)
        self.seq_ids = np.zeros(n_tokens_max, dtype=np.int32)
        self.wants_logits = np.zeros(n_tokens_max, dtype=np.int8)
        self._n_seq_id = np.ones(n_tokens_max, dtype=np.int32)
        base = self.seq_ids.ctypes.data
        self._seq_id_ptrs = (ctypes.POINTER(ctypes.c_int32) * n_tokens_max)(
            *[ctypes.cast(base + 4 * i, ctypes.POINTER(ctypes.c_int32)) for i in range(n_tokens_max)]
        )
        self.n_tokens = 0
        self.n_outputs = 0
        self._struct = _lc.llama_batch()
        self._struct.token = self.token_ids.ctypes.data_as(ctypes.POINTER(_lc.llama_token))
        self.embd = np.zeros((n_tokens_max, n_embd), dtype=np.float32) if n_embd else None
        self._struct.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if n_embd else None
        self._struct.pos = self.positions.ctypes.data_as(ctypes.POINTER(_lc.llama_pos))
        self._struct.n_seq_id = self._n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self._struct.seq_id = self._seq_id_ptrs
        self._struct.logits = self.wants_logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def clear(self) -> None:
        self.n_tokens = 0
        self.n_outputs = 0

    def add(self, seq_id: int, token_ids: list[int], first_pos: int, n_logits: int,
            embd: np.ndarray | None = None) -> int:
        """Append a run of one sequence's tokens; the last n_logits of them output logits (and
        `embd`, one row per token, where the batch carries embeddings).

        Returns the output row index of the first logits row of this run (or -1)."""
        n = len(token_ids)
        start, end = self.n_tokens, self.n_tokens + n
        if end > self.n_tokens_max:
            raise ValueError(f"batch overflow: {end} > {self.n_tokens_max}")
        if self.embd is not None:
            self.embd[start:end] = 0.0 if embd is None else embd
        if n == 1:  # a decode row: item assignments cost a tenth of slices
            self.token_ids[start] = token_ids[0]
            self.positions[start] = first_pos
            self.seq_ids[start] = seq_id
            self.wants_logits[start] = 1 if n_logits else 0
        else:
            self.token_ids[start:end] = token_ids
            self.positions[start:end] = np.arange(first_pos, first_pos + n, dtype=np.int32)
            self.seq_ids[start:end] = seq_id
            self.wants_logits[start:end] = 0
            if n_logits:
                self.wants_logits[end - n_logits : end] = 1
        self.n_tokens = end
        first_row = self.n_outputs if n_logits else -1
        self.n_outputs += n_logits
        return first_row

    def set_logits(self, index: int) -> None:
        """Make token `index` output logits too (its row lands among the others in batch order)."""
        if not self.wants_logits[index]:
            self.wants_logits[index] = 1
            self.n_outputs += 1

    def output_rows(self) -> np.ndarray:
        """Per token: its logits row (meaningful where the token outputs logits)."""
        return np.cumsum(self.wants_logits[: self.n_tokens], dtype=np.int32) - 1


class Context:
    """One llama.cpp context holding n_seq sequences (the KV slots), all decoded in one batch.

    `mtp_of`: instead, the multi-token-prediction context of that (target) context: the same
    model's MTP layers with a KV of their own, fed tokens with the target's hidden rows.
    `other`: an EAGLE3 draft's target (it borrows the target's embeddings and output head where
    the draft has none)."""

    def __init__(self, model: Model, shape: ContextShape, mtp_of: Context | None = None,
                 other: Context | None = None) -> None:
        params = _lc.llama_context_default_params()
        if mtp_of is not None:
            params.ctx_type = 1  # LLAMA_CONTEXT_TYPE_MTP
        if (mtp_of or other) is not None:
            params.ctx_other = (mtp_of or other)._ptr
        params.n_ctx = shape.n_ctx_per_seq * shape.n_seq
        params.n_batch = shape.n_batch_max
        params.n_ubatch = shape.n_ubatch
        params.n_seq_max = shape.n_seq
        params.n_threads = shape.n_threads
        params.n_threads_batch = shape.n_threads
        params.kv_unified = shape.kv_unified
        params.swa_full = shape.swa_full
        # the KV types are the names in options.KV_BYTES_PER_VALUE
        params.type_k = params.type_v = getattr(_lc, f"GGML_TYPE_{shape.kv_type.upper()}")
        flash_attn = "on" if shape.kv_type != "f16" and shape.flash_attn == "auto" else shape.flash_attn
        params.flash_attn_type = _FLASH_ATTN[flash_attn]  # (llama.cpp needs it on for a quantized V cache)
        params.no_perf = True
        _recent_log.clear()
        self._ptr = _lc.llama_init_from_model(model._ptr, params)
        _raise_interrupt(lambda: self._ptr and _lc.llama_free(self._ptr))
        if not self._ptr:
            raise ModelLoadError(f"llama.cpp could not create a context: {recent_log(3) or 'unknown error'}")
        self.model = model
        self.shape = shape
        self.n_ctx: int = _lc.llama_n_ctx(self._ptr)
        # embedding columns its batches carry: an MTP context's take the target's hidden rows, an EAGLE3
        # head's (a draft with a target) their fused features
        self.n_embd_inp = model.n_embd_out if mtp_of is not None else model.n_embd if other is not None else 0
        self._memory = _lc.llama_get_memory(self._ptr)
        self._n_vocab = model.n_vocab
        self._logits = np.empty((0, self._n_vocab), dtype=np.float32)  # a view of llama.cpp's output buffer
        self._logits_address: int | None = None
        self._first_rows: dict[int, np.ndarray] = {}  # n -> self._logits[:n] (a slice costs ~10 us after a decode)

    def decode(self, batch: Batch) -> np.ndarray:
        """Run one llama_decode; returns the logits rows (n_outputs, n_vocab) as a no-copy view.

        NOTE: the view is only valid until the next decode on this context."""
        if batch.n_tokens == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        if batch.n_tokens > self.shape.n_batch_max:  # llama.cpp would abort the process
            raise ValueError(f"batch of {batch.n_tokens} tokens exceeds the context's n_batch {self.shape.n_batch_max}")
        batch._struct.n_tokens = batch.n_tokens
        _has_decoded.team = True
        rc = _lc.llama_decode(self._ptr, batch._struct)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}: {recent_log(2)}")
        if batch.n_outputs == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        address = _logits_address(self._ptr)
        n = batch.n_outputs
        if address != self._logits_address or n > len(self._logits):
            # NOTE: as_array builds a ctypes array type per call; most steps reuse the view of the
            # buffer llama.cpp keeps between decodes, and its first rows' views
            ptr = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            self._logits = np.ctypeslib.as_array(ptr, shape=(n, self._n_vocab))
            self._logits_address = address
            self._first_rows.clear()
        rows = self._first_rows.get(n)
        if rows is None:
            rows = self._first_rows[n] = self._logits[:n]
        return rows

    # -- hidden rows (the staging calls; runtime/staging.py) ------------------------------------
    def capture_hidden(self, masked: bool = False, on: bool = True) -> None:
        """From the next decode on, keep each token's last hidden row (all rows, in batch order;
        `masked`: only the rows that output logits), or with `on` False, stop."""
        staging.call("llama_set_embeddings_nextn", self._ptr, on, masked)

    def hidden(self, n_rows: int) -> np.ndarray:
        """The last decode's hidden rows (n_rows, n_embd_out): a copy."""
        ptr = staging.call("llama_get_embeddings_nextn", self._ptr)
        if not ptr:
            raise RuntimeError("llama.cpp kept no hidden rows for the last decode")
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.model.n_embd_out)).copy()

    def encode(self, rows: np.ndarray) -> np.ndarray:
        """Run the encoder (an EAGLE3 head's fc) on embedding rows, a micro-batch at a time; its
        output rows (n, n_embd_out), read as hidden rows (capture_hidden first)."""
        out = []
        zero = ctypes.c_int32(0)
        for start in range(0, len(rows), self.shape.n_ubatch):
            chunk = np.ascontiguousarray(rows[start : start + self.shape.n_ubatch], dtype=np.float32)
            n = len(chunk)
            n_seq_id, wants = np.ones(n, dtype=np.int32), np.ones(n, dtype=np.int8)
            seq_ids = (ctypes.POINTER(ctypes.c_int32) * n)(*[ctypes.pointer(zero)] * n)
            batch = _lc.llama_batch()
            batch.n_tokens = n
            batch.token, batch.pos = None, None  # (positions: llama.cpp's own; the encoder uses none)
            batch.embd = chunk.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            batch.n_seq_id = n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            batch.seq_id = seq_ids
            batch.logits = wants.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
            rc = _lc.llama_encode(self._ptr, batch)
            if rc != 0:
                raise RuntimeError(f"llama_encode failed with code {rc}: {recent_log(2)}")
            out.append(self.hidden(n))
        return np.vstack(out) if out else np.empty((0, self.model.n_embd_out), dtype=np.float32)

    def capture_layer_input(self, layer: int, on: bool = True) -> None:
        """From the next decode on, keep every token's input to this layer (EAGLE3's taps), or stop."""
        staging.call("llama_set_embeddings_layer_inp", self._ptr, layer, on)

    def layer_input(self, layer: int, n_rows: int) -> np.ndarray:
        ptr = staging.call("llama_get_embeddings_layer_inp", self._ptr, layer)
        if not ptr:
            raise RuntimeError(f"llama.cpp kept no input rows for layer {layer}")
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.model.n_embd)).copy()

    # -- KV sequence operations -----------------------------------------------------------
    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of a sequence (p1 < 0: to the end)."""
        return bool(_lc.llama_memory_seq_rm(self._memory, seq_id, p0, p1))

    def kv_pos_min(self, seq_id: int) -> int:
        """The first position a sequence's KV still holds in every layer (-1: none)."""
        return int(_lc.llama_memory_seq_pos_min(self._memory, seq_id))

    def window_state(self, seq_id: int) -> ctypes.Array:
        """A copy of one sequence's sliding-window layers' KV (llama.cpp's SWA-only state)."""
        flags = _lc.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY
        size = _lc.llama_state_seq_get_size_ext(self._ptr, seq_id, flags)
        state = (ctypes.c_uint8 * size)()
        if _lc.llama_state_seq_get_data_ext(self._ptr, state, size, seq_id, flags) != size:
            raise RuntimeError(f"llama.cpp could not copy sequence {seq_id}'s window: {recent_log(2)}")
        return state

    def restore_window_state(self, seq_id: int, state: ctypes.Array) -> None:
        """Put a window_state() back as a sequence's sliding-window layers' KV (replacing theirs)."""
        flags = _lc.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY
        if _lc.llama_state_seq_set_data_ext(self._ptr, state, len(state), seq_id, flags) == 0:
            raise RuntimeError(f"llama.cpp could not restore sequence {seq_id}'s window: {recent_log(2)}")

    def kv_copy(self, src_seq: int, dst_seq: int, p0: int = 0, p1: int = -1) -> None:
        _lc.llama_memory_seq_cp(self._memory, src_seq, dst_seq, p0, p1)

    def kv_keep(self, seq_id: int) -> None:
        _lc.llama_memory_seq_keep(self._memory, seq_id)

    def kv_clear(self) -> None:
        _lc.llama_memory_clear(self._memory, True)

    def kv_pos_max(self, seq_id: int) -> int:
        """Largest cached position of a sequence, -1 when empty."""
        return int(_lc.llama_memory_seq_pos_max(self._memory, seq_id))

    def set_threads(self, n_threads: int) -> None:
        """llama.cpp's CPU threads for the next decodes (only between two decodes: the engine thread's)."""
        _lc.llama_set_n_threads(self._ptr, n_threads, n_threads)

    def close(self) -> None:
        if self._ptr:
            _lc.llama_free(self._ptr)
            self._ptr = None


class EmbeddingContext:
    """A context of its own for embeddings (never shared with generation): several inputs per
    decode, each a sequence pooled into one vector. The model's own pooling (an embedding model's
    GGUF names it) or, for a generative model, the mean of its last hidden states."""

    def __init__(self, model: Model, n_ctx: int, n_seq_max: int, n_threads: int) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self._ptr = self._create(_lc.LLAMA_POOLING_TYPE_UNSPECIFIED, n_threads)
        self.pooling = "model"
        if _lc.llama_pooling_type(self._ptr) == _lc.LLAMA_POOLING_TYPE_NONE:  # a generative model: mean-pool it
            _lc.llama_free(self._ptr)
            self._ptr = self._create(_lc.LLAMA_POOLING_TYPE_MEAN, n_threads)
            self.pooling = "mean"
        self._memory = _lc.llama_get_memory(self._ptr)
        self.n_embd: int = _lc.llama_model_n_embd(model._ptr)
        self._batch = Batch(n_ctx)

    def _create(self, pooling: int, n_threads: int) -> Any:
        params = _lc.llama_context_default_params()
        params.embeddings = True
        params.pooling_type = pooling
        params.n_ctx = params.n_batch = params.n_ubatch = self.n_ctx  # a non-causal model needs an input whole
        params.n_seq_max = self.n_seq_max
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        _recent_log.clear()
        ptr = _lc.llama_init_from_model(self.model._ptr, params)
        if not ptr:
            raise ModelLoadError(f"llama.cpp could not create an embedding context: {recent_log(3) or 'unknown'}")
        return ptr

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """One decode for these inputs (at most n_seq_max, n_ctx tokens in all): (len(inputs), n_embd)."""
        assert 0 < len(inputs) <= self.n_seq_max and sum(map(len, inputs)) <= self.n_ctx
        _lc.llama_memory_clear(self._memory, True)
        batch = self._batch
        batch.clear()
        for seq_id, ids in enumerate(inputs):
            batch.add(seq_id, ids, 0, len(ids))
        batch._struct.n_tokens = batch.n_tokens
        rc = _lc.llama_decode(self._ptr, batch._struct)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}: {recent_log(2)}")
        out = np.empty((len(inputs), self.n_embd), dtype=np.float32)
        for seq_id in range(len(inputs)):
            ptr = _lc.llama_get_embeddings_seq(self._ptr, seq_id)
            if not ptr:
                raise RuntimeError(f"llama.cpp returned no embedding for input {seq_id}")
            out[seq_id] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
        return out

    def close(self) -> None:
        if self._ptr:
            _lc.llama_free(self._ptr)
            self._ptr = None


QUANT_TYPES: dict[str, int] = {
    "f16": _lc.LLAMA_FTYPE_MOSTLY_F16,
    "q8_0": _lc.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_0": _lc.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q4_1": _lc.LLAMA_FTYPE_MOSTLY_Q4_1,
}


def quantize(src: Path, dst: Path, quant: str, n_threads: int | None = None) -> None:
    """Write `src` re-quantized to `quant` at `dst` (llama_model_quantize, requantize allowed)."""
    init_backend()
    params = _lc.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[quant]
    params.allow_requantize = True
    params.nthread = n_threads or os.cpu_count() or 1
    _recent_log.clear()
    rc = _lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise ModelLoadError(f"quantizing {src.name} to {quant} failed: {recent_log(3)}")
