"""The one module that imports llama.cpp's libmtmd: a vision (or audio) projector beside a text model.

An image becomes one `ImageChunk` (a tiling projector's, e.g. SmolVLM's idefics3, one per tile
and one for the overview; an audio clip one per 30-second window of a whisper-style encoder): the text tokens the projector wants around it (a model's <start_of_image> and the like)
and the span itself, n_tokens positions that are decoded from the projector's embeddings rather
than from tokens. Encoding (the vision encoder) and decoding (its rows into one KV sequence) run
on the engine's thread, one span per step.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as _lc
from llama_cpp import mtmd_cpp as _mtmd

from runner.core.errors import ModelLoadError
from runner.runtime.llama import Context, Model, init_backend, log_callback, recent_log
from runner.runtime.webp import is_webp, webp_as_png

CHUNK_TEXT, CHUNK_IMAGE, CHUNK_AUDIO = 0, 1, 2
_NO_CALLBACK = _mtmd.mtmd_helper_post_decode_callback()


class MediaError(ValueError):
    """An input the projector cannot take (undecodable, not an image): the request's fault."""


KINDS = {CHUNK_IMAGE: "image", CHUNK_AUDIO: "audio"}
# libmtmd asserts (aborting the process) on a clip of one sample, and on one of fewer than two of its
# mel frames (hop 160) where the projector normalizes per feature: a tenth of a second is far from both
MIN_AUDIO_SAMPLES = 1600
UNREADABLE = {"image": "the image could not be decoded (png, jpeg, gif, bmp and webp are read)",
              "audio": "the audio could not be decoded (wav, mp3 and flac are read)",
              None: "the file could not be decoded (images: png, jpeg, gif, bmp, webp; audio: wav, mp3, flac)"}


@dataclass(frozen=True)
class ImageChunk:
    """One span of an image or clip as the prompt holds it: tokens before, the span, tokens after."""

    key: str  # the content's SHA-256 (libmtmd's id; a clip's windows add their index): equal content, equal spans
    n_tokens: int  # positions the span takes in the KV (and in the prompt)
    n_pos: int  # how far positions advance (M-RoPE models: not the token count)
    before: tuple[int, ...]
    after: tuple[int, ...]
    handle: _ChunkHandle
    # encoded ahead (off the engine thread), else at decode
    embeddings: np.ndarray | None = field(default=None, compare=False, repr=False)
    kind: str = "image"  # or "audio": a clip is a span as an image is


class _ChunkHandle:
    """Owns one libmtmd chunk (freed with the last reference)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr
        weakref.finalize(self, _mtmd.mtmd_input_chunk_free, ptr)


class Projector:
    """A model's mmproj: what it takes, turning image bytes into chunks, encoding, decoding."""

    def __init__(self, path: Path, model: Model, n_threads: int, use_gpu: bool = False) -> None:
        init_backend()
        _route_log()
        params = _mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.warmup = False
        params.print_timings = False
        self.path = Path(path)
        self._ptr = _mtmd.mtmd_init_from_file(str(path).encode(), model._ptr, params)
        if not self._ptr:
            raise ModelLoadError(f"llama.cpp could not load the projector {path} for this model: "
                                 f"{recent_log(3) or 'unknown error'}")
        self.takes_images = bool(_mtmd.mtmd_support_vision(self._ptr))
        self.takes_audio = bool(_mtmd.mtmd_support_audio(self._ptr))
        self.uses_mrope = bool(_mtmd.mtmd_decode_use_mrope(self._ptr))
        self.n_embd = _lc.llama_model_n_embd_inp(model._ptr)
        self._marker = _mtmd.mtmd_get_marker(self._ptr) or _mtmd.mtmd_default_marker()
        self._lock = threading.Lock()  # one libmtmd call at a time (chunks are made on request threads)
        self.n_encodes = 0  # images run through the encoder (tests count them)

    def chunks(self, data: bytes, kind: str | None = None) -> tuple[ImageChunk, ...]:
        """The image (png, jpeg, gif, bmp...) or audio clip (wav, mp3, flac) as its prompt spans (an
        image one, or one per tile; a clip one per window), told apart by libmtmd from the bytes; MediaError if it
        cannot read it, if it is not `kind`, or if this projector takes no such input."""
        if is_webp(data):  # (libmtmd would hand it to ffmpeg, where one is installed)
            png = webp_as_png(data)
            if png is None:
                raise MediaError(UNREADABLE["image"])
            data = png
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with self._lock:
            bitmap = _mtmd.mtmd_helper_bitmap_init_from_buf(self._ptr, buf, len(data), False)
            if not bitmap:  # (said for what this projector takes, where the caller did not say)
                if kind is None and looks_like_audio(data) and not self.takes_audio:
                    raise MediaError("this model's projector takes no audio")  # (libmtmd reads no clip then)
                takes = ("image",) * self.takes_images + ("audio",) * self.takes_audio
                raise MediaError(UNREADABLE[kind or (takes[0] if len(takes) == 1 else None)])
            try:
                found = "audio" if _mtmd.mtmd_bitmap_is_audio(bitmap) else "image"
                if kind is not None and found != kind:
                    raise MediaError(f"this is {'an image' if found == 'image' else 'audio'}, not {kind}")
                if not (self.takes_audio if found == "audio" else self.takes_images):
                    raise MediaError(f"this model's projector takes no {'images' if found == 'image' else 'audio'}")
                n_samples = _mtmd.mtmd_bitmap_get_n_bytes(bitmap) // 4  # (float samples, at the projector's rate)
                if found == "audio" and n_samples < MIN_AUDIO_SAMPLES:  # (libmtmd aborts the process on fewer)
                    raise MediaError(f"the clip is too short: at least {MIN_AUDIO_SAMPLES:,} samples (0.1 s at 16 kHz)")
                return self._tokenize(bitmap)
            finally:
                _mtmd.mtmd_bitmap_free(bitmap)

    def _tokenize(self, bitmap: int) -> tuple[ImageChunk, ...]:
        chunks = _mtmd.mtmd_input_chunks_init()
        try:
            text = _mtmd.mtmd_input_text()
            text.text, text.text_len, text.add_special, text.parse_special = (self._marker, len(self._marker),
                                                                              False, True)
            bitmaps = (_mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = _mtmd.mtmd_tokenize(self._ptr, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise MediaError(f"the image could not be prepared for this projector (libmtmd code {rc})")
            texts: list[list[int]] = [[]]  # the text before each span, then after the last
            media = []
            for i in range(_mtmd.mtmd_input_chunks_size(chunks)):
                chunk = _mtmd.mtmd_input_chunks_get(chunks, i)
                if _mtmd.mtmd_input_chunk_get_type(chunk) == CHUNK_TEXT:
                    texts[-1].extend(_text_tokens(chunk))
                else:
                    media.append(chunk)
                    texts.append([])
            if not media:
                raise MediaError("the projector made no image span of this image")
            spans = []
            for i, chunk in enumerate(media):  # (a clip's windows, an image's tiles share its id: each key adds its index)
                key = (_mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode() + (f":{i}" if len(media) > 1 else "")
                spans.append(self._span(chunk, key, texts[i], texts[-1] if i == len(media) - 1 else []))
            return tuple(spans)
        finally:
            _mtmd.mtmd_input_chunks_free(chunks)

    @staticmethod
    def _span(chunk: int, key: str, before: list[int], after: list[int]) -> ImageChunk:
        """One media chunk as an ImageChunk that owns a copy of it (the list it came from is freed)."""
        return ImageChunk(key, int(_mtmd.mtmd_input_chunk_get_n_tokens(chunk)), int(_mtmd.mtmd_input_chunk_get_n_pos(chunk)),
                          tuple(before), tuple(after), _ChunkHandle(_mtmd.mtmd_input_chunk_copy(chunk)),
                          kind=KINDS.get(_mtmd.mtmd_input_chunk_get_type(chunk), "image"))

    def encode(self, image: ImageChunk) -> np.ndarray:
        """The image's embeddings, (n_tokens, n_embd) float32, owned by the caller."""
        with self._lock:
            rc = _mtmd.mtmd_encode_chunk(self._ptr, image.handle.ptr)
            if rc != 0:
                raise RuntimeError(f"the projector failed to encode an image (code {rc}): {recent_log(2)}")
            self.n_encodes += 1
            out = _mtmd.mtmd_get_output_embd(self._ptr)
            return np.ctypeslib.as_array(out, shape=(image.n_tokens * self.n_embd,)).reshape(
                image.n_tokens, self.n_embd).copy()

    def decode(self, context: Context, image: ImageChunk, embeddings: np.ndarray, seq_id: int, first_pos: int) -> int:
        """Decode the image's embeddings into one KV sequence from first_pos (non-causal spans as the
        projector asks, in the context's micro-batches); returns the next free position."""
        embd = np.ascontiguousarray(embeddings, dtype=np.float32)
        new_pos = _lc.llama_pos(0)
        # no lock: the helper reads only the projector's fixed settings (causal, M-RoPE), so the engine
        # decodes while another thread encodes the next image
        rc = _mtmd.mtmd_helper_decode_image_chunk(
            self._ptr, context._ptr, image.handle.ptr, embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            first_pos, seq_id, context.shape.n_ubatch, ctypes.byref(new_pos), _NO_CALLBACK, None)
        if rc != 0:
            raise RuntimeError(f"decoding an image into the KV failed (code {rc}): {recent_log(2)}")
        return int(new_pos.value)

    def close(self) -> None:
        if self._ptr:
            _mtmd.mtmd_free(self._ptr)
            self._ptr = None


def looks_like_audio(data: bytes) -> bool:
    """WAV, FLAC or MP3 by their first bytes (an ID3 tag, or an MPEG frame's sync bits)."""
    return ((data[:4] == b"RIFF" and data[8:12] == b"WAVE") or data[:4] == b"fLaC" or data[:3] == b"ID3"
            or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0))


def _text_tokens(chunk: int) -> list[int]:
    n = ctypes.c_size_t(0)
    ptr = _mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
    return [int(ptr[i]) for i in range(n.value)]


def _route_log() -> None:
    """libmtmd logs on its own (to stderr): into llama.py's ring of recent lines, as llama.cpp's."""
    _mtmd.mtmd_log_set(log_callback(), ctypes.c_void_p(0))
    _mtmd.mtmd_helper_log_set(log_callback(), ctypes.c_void_p(0))
