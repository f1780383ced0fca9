"""Images: what encoding once saves, and how long an image stalls another slot's stream.

    python bench/images.py [--model smollm2-135m-instruct] [--repeats 3]

No vision model can be downloaded here, so the projector is a random one of a real encoder's size
(SigLIP-base-like: width 768, 12 blocks, 224 x 224 images in 14 x 14 patches = 256 image tokens,
~86M parameters, F32) in front of SmolLM2; its output is noise, its cost is a real encoder's.
Engine in-process (no HTTP), greedy, 2 slots.

- TTFT of a chat's second turn with the same image against its first turn (the image new to the
  server): the second reuses the image's KV. Also the first turn's TTFT with the image's KV gone
  but its embeddings kept (--media-cache-mb): decoded, not encoded.
- One slot streams text; an image request arrives (encoded on its own thread while the engine steps,
  as in the server): the longest gap between the stream's tokens while the image goes in, against
  the stream's median inter-token time.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import model_path, print_table  # noqa: E402
from tiny_mmproj import png_bytes, write_tiny_mmproj  # noqa: E402

from runner.config.options import EngineOptions  # noqa: E402
from runner.model.loaded_model import LoadedModel  # noqa: E402
from runner.prompt.chat_template import Message, image_mark  # noqa: E402
from runner.sampling.params import SamplingParams  # noqa: E402
from runner.scheduler.request import GenerationRequest, StreamEvent  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


def run_until_first_token(loaded: LoadedModel, request: GenerationRequest) -> tuple[float, str]:
    """Seconds from submit to the first token (then it runs to the end), and the reply."""
    first: list[float] = []
    text: list[str] = []
    started = time.perf_counter()

    def sink(event: StreamEvent) -> None:
        if event.token_ids and not first:
            first.append(time.perf_counter() - started)
        text.append(event.text)

    loaded.engine.submit(request, sink)
    while loaded.engine.has_work:
        loaded.engine.step()
    return first[0], "".join(text)


def turns(loaded: LoadedModel, image: bytes, n: int) -> list[tuple[float, float, float]]:
    """(first turn cold, second turn, first turn with only the embeddings kept), n times; each from
    the image's bytes, as a server gets them (image_chunk: the span, encoded or found in the cache)."""
    out = []
    for i in range(n):
        data = image + bytes([i])  # (trailing bytes change the content hash, not the picture)
        first = [Message("user", f"Describe this picture. {image_mark(0)}")]

        def ttft(name: str, messages: list[Message]) -> tuple[float, str]:
            started = time.perf_counter()
            ids, spans = loaded.chat_prompt(messages, None, [loaded.image_chunk(data)])
            prepared = time.perf_counter() - started
            seconds, reply = run_until_first_token(loaded, GenerationRequest(name, ids, GREEDY, max_tokens=4,
                                                                             media=spans))
            return prepared + seconds, reply

        cold, reply = ttft(f"a{i}", first)
        # the next turn as a chat client sends it: the model's own reply, then the new question
        warm, _ = ttft(f"b{i}", first + [Message("assistant", reply), Message("user", "What colour is it?")])
        loaded.runner.context.kv_clear()
        for slot in loaded.engine.scheduler.pool.slots:
            slot.truncate(0)
        cached, _ = ttft(f"c{i}", first)
        out.append((cold, warm, cached))
    return out


def stall(loaded: LoadedModel, image: bytes) -> tuple[float, float]:
    """(longest gap, median gap) between a text stream's tokens while an image request goes in: the
    engine steps on its own thread, the image is read and encoded on this one (as a server's request
    thread does) and then handed to the engine between two steps."""
    times: list[float] = []
    handed: queue.Queue[GenerationRequest] = queue.Queue()
    text_ids = loaded.chat_prompt_ids([Message("user", "Write a long story about the sea.")])
    loaded.engine.submit(GenerationRequest("text", text_ids, GREEDY, max_tokens=160, ignore_eos=True),
                         lambda e: times.extend([time.perf_counter()] * len(e.token_ids)))

    def engine_loop() -> None:
        submitted = False
        while loaded.engine.has_work or not submitted:
            if not submitted and not handed.empty():
                loaded.engine.submit(handed.get(), lambda e: None)
                submitted = True
            loaded.engine.step()

    for _ in range(40):
        loaded.engine.step()
    stepping = threading.Thread(target=engine_loop)
    stepping.start()
    ids, spans = loaded.chat_prompt([Message("user", f"Describe this. {image_mark(0)}")], None,
                                    [loaded.image_chunk(image + b"stall")])
    handed.put(GenerationRequest("image", ids, GREEDY, max_tokens=8, media=spans))
    stepping.join()
    gaps = [b - a for a, b in zip(times[1:], times[2:])]
    return max(gaps), statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proj = write_tiny_mmproj(Path(tmp) / "mmproj-siglip-size.gguf", n_embd_text=576, n_embd=768, n_ff=3072,
                                 n_block=12, n_head=12, projection_dim=576, image_size=224, patch_size=14)
        loaded = LoadedModel(model_path(args.model), EngineOptions(parallel=2, ctx_size=2048, mmproj=str(proj)),
                             log=lambda _: None)
        image = png_bytes(320, 240)
        try:
            results = turns(loaded, image, args.repeats)
            longest, median_gap = stall(loaded, image)
        finally:
            loaded.close()
    cold = statistics.median(r[0] for r in results)
    warm = statistics.median(r[1] for r in results)
    cached = statistics.median(r[2] for r in results)
    print_table(["what", "TTFT (ms)", "ratio to the first turn"], [
        ["first turn (image new)", f"{cold * 1000:.0f}", "1.00x"],
        ["second turn, same image (its KV reused)", f"{warm * 1000:.0f}", f"{cold / warm:.1f}x faster"],
        ["first turn again, KV gone, embeddings kept", f"{cached * 1000:.0f}", f"{cold / cached:.1f}x faster"],
    ])
    print_table(["text stream beside an image request", "ms", "x its median gap"], [
        ["median inter-token gap", f"{median_gap * 1000:.1f}", "1.0x"],
        ["longest gap (the image encoded beside, then decoded)", f"{longest * 1000:.1f}", f"{longest / median_gap:.1f}x"],
    ])


if __name__ == "__main__":
    main()
