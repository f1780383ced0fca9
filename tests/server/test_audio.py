"""Audio in prompts: a tiny text model with a tiny whisper-style audio projector (tests/tiny_audio_mmproj.py:
every clip is 50 positions), OpenAI's input_audio parts, the CLI's --audio and the Python API, and
every bad input's 400."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines import in_process_server, load_tiny
from runner import Runner
from runner.core.errors import RunnerError
from runner.prompt.chat_template import image_mark
from tiny_audio_mmproj import wav_bytes, write_tiny_audio_mmproj
from tiny_mmproj import png_bytes, write_tiny_mmproj

N_AUDIO_TOKENS = 50
WAV = wav_bytes(1.0, 440.0)


def audio_part(data: bytes = WAV, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def post(client: Any, parts: list[dict[str, Any]]) -> Any:
    return client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, *parts]}]})


@pytest.fixture(scope="module")
def audio_mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_audio_mmproj(tmp_path_factory.mktemp("audio") / "mmproj-audio.gguf")


@pytest.fixture
def hearing(tiny_gguf: Path, audio_mmproj: Path) -> Iterator[Any]:
    loaded = load_tiny(tiny_gguf, 2, mmproj=str(audio_mmproj), ctx_size=512)
    with in_process_server(loaded) as client:
        yield client


def test_a_clip_is_a_span_of_the_prompt_and_changes_the_greedy_reply(hearing: Any) -> None:
    with_audio, again = post(hearing, [audio_part()]), post(hearing, [audio_part()])
    other = post(hearing, [audio_part(wav_bytes(1.0, 880.0))])
    without = post(hearing, [])
    assert with_audio.status_code == again.status_code == other.status_code == without.status_code == 200
    reply = with_audio.json()["choices"][0]["message"]["content"]
    assert again.json()["choices"][0]["message"]["content"] == reply
    assert without.json()["choices"][0]["message"]["content"] != reply
    assert other.json()["choices"][0]["message"]["content"] != reply  # (another tone: other embeddings)
    assert with_audio.json()["usage"]["prompt_tokens"] == without.json()["usage"]["prompt_tokens"] + N_AUDIO_TOKENS
    assert hearing.get("/v1/models").json()["data"][0]["inputs"] == ["text", "audio"]


def test_bad_audio_is_a_400_naming_the_part(hearing: Any) -> None:
    cases = {
        "undecodable": (audio_part(b"RIFF\x00\x00\x00\x00WAVEnot really"), "invalid_audio",
                        "messages[0].content[1]: the audio could not be decoded (wav, mp3 and flac are read)"),
        "an image": (audio_part(png_bytes(40, 30)), "invalid_audio", "messages[0].content[1]: this is an image, not audio"),
        "one sample": (audio_part(wav_bytes(seconds=1 / 16000)), "invalid_audio",  # (libmtmd aborted the process)
                       "messages[0].content[1]: the clip is too short: at least 1,600 samples (0.1 s at 16 kHz)"),
        "format": (audio_part(fmt="ogg"), None, "messages[0].content[1]: the audio's format must be one of wav, mp3, flac"),
        "base64": ({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}, None,
                   "messages[0].content[1]: the audio data is not valid base64"),
        "an image to a model that only hears": (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png_bytes(40, 30)).decode()}},
            "model_takes_no_images", None),
    }
    for name, (part, code, message) in cases.items():
        r = post(hearing, [part])
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "messages[0].content[1]", (name, r.text)
        assert code is None or error["code"] == code, (name, error)
        assert message is None or error["message"] == message, (name, error)
    assert post(hearing, []).status_code == 200  # (no slot stuck)


def test_audio_to_a_model_that_only_sees_is_a_400(tiny_gguf: Path, tmp_path: Path) -> None:
    loaded = load_tiny(tiny_gguf, 1, mmproj=str(write_tiny_mmproj(tmp_path / "mmproj.gguf")))
    with in_process_server(loaded) as client:
        r = post(client, [audio_part()])
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_takes_no_audio"
    assert r.json()["error"]["message"].startswith("messages[0].content[1]: this model takes no audio")
    with Runner(tiny_gguf, mmproj=str(tmp_path / "mmproj.gguf"), ctx_size=512, log=lambda _: None) as api:
        with pytest.raises(RunnerError) as caught:  # (bytes of either kind: told apart by their header)
            api.chat([{"role": "user", "content": image_mark(0) + "what is this?"}], images=[WAV], max_tokens=1)
    assert str(caught.value) == "image 1: this model's projector takes no audio"


def test_the_cli_and_the_python_api_send_a_clip(tiny_gguf: Path, audio_mmproj: Path, tmp_path: Path) -> None:
    clip = tmp_path / "tone.wav"
    clip.write_bytes(WAV)
    out = subprocess.run([sys.executable, "-m", "runner", "run", str(tiny_gguf), "-p", "what is this?", "--audio",
                          str(clip), "--mmproj", str(audio_mmproj), "--ctx-size", "512", "--temperature", "0",
                          "--max-tokens", "8", "-q"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with Runner(tiny_gguf, mmproj=str(audio_mmproj), ctx_size=512, log=lambda _: None) as api:
        expected = api.chat([{"role": "user", "content": image_mark(0) + "what is this?"}], images=[clip],
                            temperature=0.0, max_tokens=8)
        as_text = api.chat([{"role": "user", "content": image_mark(0) + "what is this?"}], images=[str(clip)],
                           temperature=0.0, max_tokens=8)  # (a path given as a str, as the model may be)
        plain = api.chat([{"role": "user", "content": "what is this?"}], temperature=0.0, max_tokens=8)
    assert out.stdout == expected + "\n" and expected != plain and as_text == expected


def test_a_clip_longer_than_one_window_is_every_window_of_the_prompt(hearing: Any) -> None:
    """A whisper-style encoder hears 30 seconds at a time: a 40 s clip is two spans, and what is
    said after the first 30 s reaches the model (a clip was cut to its first window)."""
    def clip(tail_hz: float) -> bytes:
        import io
        import wave

        def samples(wav: bytes) -> bytes:
            with wave.open(io.BytesIO(wav)) as f:
                return f.readframes(f.getnframes())
        out = io.BytesIO()
        with wave.open(out, "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(16000)
            f.writeframes(samples(wav_bytes(30.0, 440.0)) + samples(wav_bytes(10.0, tail_hz)))
        return out.getvalue()

    short, tone_tail, other_tail = post(hearing, [audio_part()]), post(hearing, [audio_part(clip(440.0))]), \
        post(hearing, [audio_part(clip(1760.0))])
    assert short.status_code == tone_tail.status_code == other_tail.status_code == 200, other_tail.text
    assert tone_tail.json()["usage"]["prompt_tokens"] == short.json()["usage"]["prompt_tokens"] + N_AUDIO_TOKENS
    assert other_tail.json()["choices"][0]["message"]["content"] != tone_tail.json()["choices"][0]["message"]["content"]
    again = post(hearing, [audio_part(clip(1760.0))])  # (its KV reused: the same reply)
    assert again.json()["choices"][0]["message"]["content"] == other_tail.json()["choices"][0]["message"]["content"]


def test_clips_that_alone_fill_the_context_are_refused_before_any_encode(tiny_gguf: Path, audio_mmproj: Path) -> None:
    """A clip is a span per 30 s: an hour of audio was encoded, window by window, only to be refused."""
    loaded = load_tiny(tiny_gguf, 1, mmproj=str(audio_mmproj), ctx_size=128)
    with in_process_server(loaded) as client:
        r = post(client, [audio_part(wav_bytes(65.0, 440.0))])  # (3 windows: 150 positions)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["message"] == ("the request's 1 image(s) and clip(s) take 150 positions; a slot's context "
                                            "holds 128")
    assert loaded.runner.images.n_encodes == 0
