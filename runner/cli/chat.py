"""`runner chat`: an interactive REPL with streamed replies, or one plain reply for piped input."""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runner.core.errors import RunnerError
from runner.python_api.runner import Runner
from runner.prompt.chat_template import IMAGE_MARK, Message, image_mark
from runner.scheduler.request import StreamEvent

HELP = (
    "commands: /exit  /clear (forget the conversation)  /system TEXT (set the system prompt)  /image FILE (send an\n"
    "image with your next message; a model with a projector, --mmproj)  /audio FILE (a clip, where it hears)  /help\n"
    'multi-line input: a line with """, then your text, then """ again; Ctrl-C stops a reply, Ctrl-D exits'
)
MULTILINE = '"""'


@dataclass
class ReplyStats:
    n_tokens: int
    elapsed_s: float
    ttft_s: float | None
    was_stopped: bool
    n_drafted: int = 0  # tokens of the reply accepted from speculative drafts

    def line(self) -> str:
        rate = self.n_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
        ttft = f"{self.ttft_s * 1000:.0f} ms" if self.ttft_s is not None else "n/a"
        stopped = ", stopped" if self.was_stopped else ""
        drafted = f", {self.n_drafted} from drafts ({self.n_drafted / self.n_tokens:.0%})" if self.n_drafted else ""
        return f"[{self.n_tokens} tokens, {rate:.1f} tok/s, first token {ttft}{drafted}{stopped}]"


@dataclass
class Conversation:
    system: str | None = None
    turns: list[Message] = field(default_factory=list)
    images: list[Path] = field(default_factory=list)  # every image sent so far, in order
    attached: list[Path] = field(default_factory=list)  # for the next user message

    def messages(self) -> list[Message]:
        head = [Message("system", self.system)] if self.system else []
        return head + self.turns

    def ask(self, text: str) -> None:
        """The user's next message, with the images attached since the last one before its text."""
        marks = "".join(image_mark(len(self.images) + i) for i in range(len(self.attached)))
        self.turns.append(Message("user", marks + text))
        self.images += self.attached
        self.attached = []

    def drop_last_question(self) -> None:
        question = self.turns.pop()
        del self.images[len(self.images) - question.content.count(IMAGE_MARK) // 2:]


class _StopFlag:
    """SIGINT during a reply sets a flag (checked between engine steps) instead of raising."""

    def __init__(self) -> None:
        self.is_set = False

    def __enter__(self) -> _StopFlag:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, *_: Any) -> None:
        self.is_set = True

    def __exit__(self, *_: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def stream_reply(runner: Runner, messages: list[Message], out: TextIO, images: Sequence[Path] = (),
                 **kwargs: Any) -> tuple[str, ReplyStats]:
    return stream_events(lambda: runner.stream_chat(messages, images=images, **kwargs), out)


def stream_events(start: Callable[[], Generator[StreamEvent, None, None]], out: TextIO) -> tuple[str, ReplyStats]:
    """The reply start() streams, written to out as it comes; Ctrl-C stops it (was_stopped)."""
    started = time.perf_counter()
    parts: list[str] = []
    ttft: float | None = None
    n_tokens = n_drafted = 0
    with _StopFlag() as stop:
        events = start()
        try:
            for event in events:
                if event.token_ids and ttft is None:
                    ttft = time.perf_counter() - started
                n_tokens += len(event.token_ids)
                n_drafted += sum(event.drafted)
                parts.append(event.text)
                out.write(event.text)
                out.flush()
                if event.error is not None:
                    raise RunnerError(event.error)
                if stop.is_set:
                    break
        finally:
            events.close()  # (stopped, or the output closed: cancels the request and frees its slot)
    return "".join(parts), ReplyStats(n_tokens, time.perf_counter() - started, ttft, stop.is_set, n_drafted)


def read_user_input(prompt: str = ">>> ") -> str:
    line = input(prompt)
    if line.strip() != MULTILINE:
        return line
    lines = []
    while (line := input("... ")).strip() != MULTILINE:
        lines.append(line)
    return "\n".join(lines)


def run_repl(runner: Runner, system: str | None, images: Sequence[Path] = (), **kwargs: Any) -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    convo = Conversation(system)
    print(f"chatting with {runner.loaded.name}. /help for commands, Ctrl-D to exit.")
    for image in images:  # --image, --audio: with the first message
        print(attach_image(convo, runner, str(image), None))
    interrupts = 0
    while True:
        try:
            text = read_user_input()
            interrupts = 0
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 2:
                print()
                return 0
            print("\n(press Ctrl-C again on an empty line, or Ctrl-D, to exit)")
            continue
        command, _, arg = text.strip().partition(" ")
        if command in ("/exit", "/quit", "/bye"):
            return 0
        if command == "/help":
            print(HELP)
            continue
        if command == "/clear":
            convo.turns.clear()
            convo.images.clear()
            convo.attached.clear()
            print("(conversation cleared)")
            continue
        if command == "/system":
            convo.system = arg.strip() or None
            print(f"(system prompt {'set' if convo.system else 'cleared'})")
            continue
        if command in ("/image", "/audio"):
            print(attach_image(convo, runner, arg.strip(), command[1:]))
            continue
        if not text.strip():
            continue
        if re.fullmatch(r"/[A-Za-z]+", command) and not arg:  # a mistyped command, not a message for the model
            print(f"(unknown command {command}; /help lists them)")
            continue
        convo.ask(text)
        try:
            reply, stats = stream_reply(runner, convo.messages(), sys.stdout, convo.images, **kwargs)
        except KeyboardInterrupt:  # Ctrl-C after the line was read, before the reply's own handler took over
            reply, stats = "", ReplyStats(0, 0.0, None, was_stopped=True)
        except RunnerError as exc:  # an image the projector cannot read: say so, keep chatting
            reply, stats = "", ReplyStats(0, 0.0, None, was_stopped=True)
            print(f"runner: error: {exc}", end="")
        print()
        print(stats.line())
        if reply:
            convo.turns.append(Message("assistant", reply))
        else:  # no words (stopped before the first, or an empty reply): the question is dropped too
            convo.drop_last_question()


def attach_image(convo: Conversation, runner: Runner, path_text: str, kind: str | None = "image") -> str:
    """/image FILE, /audio FILE (kind None: either): what the user is told."""
    if kind is None and not (runner.loaded.facts.takes_images or runner.loaded.facts.takes_audio):
        return f"({runner.loaded.name} takes no images or audio: start the chat with --mmproj FILE, a projector)"
    if kind == "image" and not runner.loaded.facts.takes_images:
        return f"({runner.loaded.name} takes no images: start the chat with --mmproj FILE, a vision projector)"
    if kind == "audio" and not runner.loaded.facts.takes_audio:
        return f"({runner.loaded.name} takes no audio: start the chat with --mmproj FILE, an audio projector)"
    path = Path(path_text).expanduser()
    if not path_text or not path.is_file():
        return f"(no such file: {path_text or '/' + (kind or 'image') + ' needs a FILE'})"
    convo.attached.append(path)
    return f"({path.name} goes with your next message)"


def run_piped(runner: Runner, system: str | None, images: Sequence[Path] = (), **kwargs: Any) -> int:
    convo = Conversation(system, attached=list(images))
    convo.ask(sys.stdin.read())
    _, stats = stream_reply(runner, convo.messages(), sys.stdout, convo.images, **kwargs)
    print()
    return 130 if stats.was_stopped else 0  # (as `runner run`'s)
