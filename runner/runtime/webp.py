"""WebP images as PNG: libmtmd reads PNG, JPEG, GIF and BMP itself (stb_image), and WebP only by
piping the bytes into ffmpeg where one is installed. Pillow decodes a request's WebP here instead,
in this process, and the projector gets a lossless PNG of its first frame."""

from __future__ import annotations

import io


def is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def webp_as_png(data: bytes) -> bytes | None:
    """The first frame, RGB, as PNG bytes; None where the bytes do not decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=["WEBP"]) as image:
            out = io.BytesIO()
            image.convert("RGB").save(out, format="PNG", compress_level=1)
            return out.getvalue()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
