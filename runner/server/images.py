"""Images in requests: read from a dialect's part (a data URI or raw base64), bounded before anything
decodes them (count per request, declared width x height from the file's header), and turned into
the model's image spans on a worker thread.

A small PNG can declare 50,000 x 50,000 pixels and decode to gigabytes: its header is read first."""

from __future__ import annotations

import base64
import binascii
import http.client
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from runner.prompt.chat_template import image_mark
from runner.server.errors import invalid
from runner.runtime.webp import is_webp

MAX_IMAGES = 16  # per request
MAX_SIDE = 8192  # pixels, either side
MAX_PIXELS = 32 * 2**20  # width x height (a 32-megapixel image decodes to ~100 MB of RGB)


REMOTE_TIMEOUT_S = 10.0  # --allow-remote-media: a fetch's connect and each read
REMOTE_MAX_BYTES = 20 * 10**6  # ... and its size


AUDIO_FORMATS = ("wav", "mp3", "flac")  # what libmtmd decodes


@dataclass(frozen=True)
class ImageInput:
    data: bytes
    where: str  # the request part it came from (for errors): messages[0].content[1]
    url: str = ""  # an http(s) image, fetched only where the server allows it (data is then empty)
    kind: str = "image"  # or "audio" (OpenAI's input_audio parts): a span in the prompt as an image is


class ImageParts:
    """A request's images in the order their marks appear in its messages' contents."""

    def __init__(self) -> None:
        self.images: list[ImageInput] = []

    def add_url(self, url: object, where: str) -> str:
        """An OpenAI-style image URL (data URI) as a content mark; 400 naming the part otherwise."""
        if not isinstance(url, str) or not url:
            raise invalid(f"{where}: the image's url must be a non-empty string", where, "invalid_type")
        if url.startswith(("http://", "https://")):  # fetched later, if at all (server.chat_pipeline)
            self._count(where)
            self.images.append(ImageInput(b"", where, url))
            return image_mark(len(self.images) - 1)
        if url.startswith("data:"):
            header, comma, payload = url.partition(",")
            if not comma or not header.endswith(";base64"):
                raise invalid(f"{where}: a data URI image must be base64 (data:image/png;base64,...)", where)
            url = payload
        return self.add_base64(url, where)

    def add_base64(self, payload: object, where: str) -> str:
        return self.add(_decoded(payload, where, "image"), where)

    def add(self, data: bytes, where: str) -> str:
        self._count(where)
        check_dimensions(data, where)
        self.images.append(ImageInput(data, where))
        return image_mark(len(self.images) - 1)

    def add_audio(self, part: object, where: str) -> str:
        """An OpenAI input_audio part ({data: base64, format: wav|mp3|flac}) as a content mark."""
        if not isinstance(part, dict):
            raise invalid(f"{where}: input_audio is an object {{data, format}}", where, "invalid_type")
        if part.get("format") not in AUDIO_FORMATS:
            raise invalid(f"{where}: the audio's format must be one of {', '.join(AUDIO_FORMATS)}", where)
        data = _decoded(part.get("data"), where, "audio")
        self._count(where)
        self.images.append(ImageInput(data, where, kind="audio"))
        return image_mark(len(self.images) - 1)


    def _count(self, where: str) -> None:
        if len(self.images) >= MAX_IMAGES:
            raise invalid(f"{where}: a request may hold at most {MAX_IMAGES} images and clips", where, "too_many_images")


def _decoded(payload: object, where: str, kind: str) -> bytes:
    """A part's base64 data; a 400 naming the part when it is not a base64 string."""
    if not isinstance(payload, str):
        raise invalid(f"{where}: the {kind} data must be a base64 string", where, "invalid_type")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{where}: the {kind} data is not valid base64", where) from None


def refuse_remote(image: ImageInput) -> None:
    raise invalid(f"{image.where}: this server does not fetch image URLs (a local server that fetches what it is "
                  "given can be made to reach other machines); send the image inline as a data URI "
                  "(data:image/png;base64,...), or start the server with --allow-remote-media", image.where,
                  "remote_media_off")


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if not newurl.startswith(("http://", "https://")):
            raise urllib.error.URLError(f"a redirect to {newurl.split(':', 1)[0]}: is not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch(image: ImageInput) -> bytes:
    """An http(s) image's bytes (--allow-remote-media), bounded in time and size and checked as any
    image is; a 400 naming the part when it cannot be had."""
    opener = urllib.request.build_opener(_HttpOnlyRedirects)
    request = urllib.request.Request(image.url, headers={"User-Agent": "runner"})
    deadline = time.monotonic() + REMOTE_TIMEOUT_S
    try:
        with opener.open(request, timeout=REMOTE_TIMEOUT_S) as response:
            declared = int(response.headers.get("Content-Length") or 0)
            data = b""
            while declared <= REMOTE_MAX_BYTES and len(data) <= REMOTE_MAX_BYTES:
                if time.monotonic() > deadline:  # (a server trickling bytes: the time-out is for the whole)
                    raise TimeoutError(f"it took more than {REMOTE_TIMEOUT_S:g} s")
                piece = response.read1(1 << 16)
                if not piece:
                    break
                data += piece
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise invalid(f"{image.where}: could not fetch {image.url}: {reason}", image.where, "image_fetch_failed") from None
    if declared > REMOTE_MAX_BYTES or len(data) > REMOTE_MAX_BYTES:
        raise invalid(f"{image.where}: {image.url} is larger than {REMOTE_MAX_BYTES // 10**6} MB", image.where,
                      "image_too_large")
    check_dimensions(data, image.where)
    return data


def check_dimensions(data: bytes, where: str) -> None:
    """Refuse, from the header alone, an image that is not one or declares too many pixels."""
    size = declared_size(data)
    if size is None:
        raise invalid(f"{where}: not an image this server reads (png, jpeg, gif, bmp or webp)", where,
                      "invalid_image")
    width, height = size
    if width <= 0 or height <= 0:
        raise invalid(f"{where}: the image declares {width} x {height} pixels: it has none", where, "invalid_image")
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        raise invalid(f"{where}: the image declares {width} x {height} pixels; at most {MAX_SIDE} on a side and "
                      f"{MAX_PIXELS // 2**20} megapixels are taken", where, "image_too_large")


def declared_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image file's header, or None when it is none of the formats read."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:2] == b"BM" and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        return width, abs(height)
    if is_webp(data):
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The first frame header's size (SOF0..SOF15 but DHT, JPG and DAC), walking the markers."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8X" and len(data) >= 30:
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if kind == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if kind == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None
