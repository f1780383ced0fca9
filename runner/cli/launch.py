"""`runner launch claude|codex [MODEL]`: a coding agent pointed at runner. Finds the server on
--port (or starts one with a context that holds an agent's prompt), then runs the agent with the
environment and configuration that send its requests there, and stops the server it started when
the agent exits."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner.cli.ps import API_KEY_ENV
from runner.config.options import PORT, EngineOptions, add_flags, from_args, to_flags
from runner.core.errors import RunnerError

AGENT_CTX = 32768  # tokens per slot for a server started here: an agent's first prompt is 6-25 thousand
# a server started here: one slot holding an agent's prompt, where a reply no request bounds (Codex
# sends none) may fill the slot, not stop at serve's 1,024 tokens
LAUNCH_DEFAULTS = {"parallel": 1, "ctx_size": AGENT_CTX, "max_tokens": AGENT_CTX}


@dataclass(frozen=True)
class Agent:
    executable: str
    package: str  # its npm package, for the line that says how to install it
    enough_ctx: int  # a found server whose slots hold less gets a warning line: this agent's first prompt
    # (base URL, model, key, tokens per slot or None) -> argv, env
    command: Callable[[str, str, str | None, int | None], tuple[list[str], dict[str, str]]]


def _claude(base_url: str, model: str, key: str | None, ctx: int | None) -> tuple[list[str], dict[str, str]]:
    """Claude Code speaks the Messages API at ANTHROPIC_BASE_URL; every model it asks for by tier
    (its background calls use the small one) is the served one. The key goes as a bearer token
    (ANTHROPIC_AUTH_TOKEN): as ANTHROPIC_API_KEY, Claude Code asks whether to use it, and its default
    answer, no, leaves it logged out; a key of the user's own for Anthropic is not sent here. With the
    slot's size it is told the window to compact within, and that a reply takes a quarter of it at most
    (it asks for 32,000 tokens, which a small model writes until the slot is full)."""
    env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_AUTH_TOKEN": key or "runner", "ANTHROPIC_API_KEY": "",
           "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
    if ctx is not None:
        env |= {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(ctx), "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(ctx // 4)}
    return ["--model", model], env


def _codex(base_url: str, model: str, key: str | None, ctx: int | None) -> tuple[list[str], dict[str, str]]:
    """Codex speaks only the Responses API: a model provider named runner, wire_api responses; with
    the slot's size, its context window (it knows no window for a model of ours)."""
    config: dict[str, object] = {
        "model_provider": "runner", "model_providers.runner.name": "runner",
        "model_providers.runner.base_url": f"{base_url}/v1", "model_providers.runner.wire_api": "responses"}
    if ctx is not None:
        config["model_context_window"] = ctx
    env = {}
    if key is not None:
        config["model_providers.runner.env_key"] = "RUNNER_API_KEY"
        env["RUNNER_API_KEY"] = key
    argv = [arg for name, value in config.items() for arg in ("-c", f"{name}={json.dumps(value)}")]
    return [*argv, "-m", model], env


AGENTS = {"claude": Agent("claude", "@anthropic-ai/claude-code", 24576, _claude),
          "codex": Agent("codex", "@openai/codex", 8192, _codex)}


def add_launch_flags(p: argparse.ArgumentParser, default_model: str) -> None:
    p.add_argument("agent", choices=sorted(AGENTS), help="the coding agent to run")
    p.add_argument("model", nargs="?", default=None,
                   help="the model to serve when no server answers on --port (default: gemma-3-270m, "
                        f"whose context holds an agent's prompt; {default_model} does not)")
    p.add_argument("--host", default="127.0.0.1", help="the server's address (default 127.0.0.1)")
    p.add_argument("--port", type=PORT, default=8080, help="the server's port: used if one answers, else "
                                                          "one is started there (default 8080)")
    server_flags = p.add_argument_group("a server started here", "the engine flags of `runner serve`")
    add_flags(server_flags, EngineOptions, LAUNCH_DEFAULTS)
    p.add_argument("--api-key", default=None, help=f"the server's key (default: ${API_KEY_ENV}, which a server "
                                                   "started here takes too)")
    p.set_defaults(agent_args=[])  # what follows `--` on the command line: main() puts it here


def split_agent_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """`runner launch AGENT [...] -- ARGS`: runner's part and the agent's."""
    if argv[:1] != ["launch"] or "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


def late_model(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """`runner launch AGENT --port N MODEL`: argparse takes the optional MODEL only before the first
    option and leaves it over after one; it is launch's MODEL all the same. What is left over."""
    if getattr(args, "fn", None) is cmd_launch and args.model is None and extra[:1] and not extra[0].startswith("-"):
        args.model = extra[0]
        return extra[1:]
    return extra


def cmd_launch(args: argparse.Namespace) -> int:
    agent = AGENTS[args.agent]
    executable = shutil.which(agent.executable)
    if executable is None:
        raise RunnerError(f"{agent.executable} is not installed (not on PATH): `npm install -g {agent.package}`")
    base_url = f"http://{args.host}:{args.port}"
    args.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    served = _served_model(base_url, args.api_key)
    if served is not None:
        given = to_flags(from_args(EngineOptions, args), unless_as=EngineOptions(**LAUNCH_DEFAULTS))
        if given:  # (they are for a server launch starts: this one runs as it was started)
            print(f"runner: a server already answers on {args.host}:{args.port}; {' '.join(given[::2])} "
                  "would apply only to one started here", file=sys.stderr)
        return _run_agent(agent, executable, base_url, _chosen(base_url, served, args), args)
    server, log = _start_server(args)
    # a kill of launch, or its terminal closing, stops the server too (and a SIGKILL: its stdin ends)
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    served = None
    try:
        served = _wait_until_serving(base_url, server, log)
        return _run_agent(agent, executable, base_url, served, args)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        died = server.poll() is not None  # (before launch stopped it: it failed)
        _stop(server)
        if served is not None and not died:
            log.unlink(missing_ok=True)  # (the log, a line per request, is kept only where the server failed)
        elif served is not None:
            print(f"runner: the server stopped during the session (exit status {server.returncode}); its log: "
                  f"{log}", file=sys.stderr)


def _stop(process: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM, then SIGKILL past the grace."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run_agent(agent: Agent, executable: str, base_url: str, served: tuple[str, int | None],
               args: argparse.Namespace) -> int:
    model, ctx = served
    if ctx is not None and ctx < agent.enough_ctx:
        print(f"runner: warning: the server's slots hold {ctx} tokens, fewer than {agent.executable}'s first "
              f"prompt and reply take ({agent.enough_ctx}): serve with --ctx-size {AGENT_CTX}", file=sys.stderr)
    argv, env = agent.command(base_url, model, args.api_key, ctx)
    print(f"runner: {agent.executable} → {base_url} ({model})", file=sys.stderr)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the agent's (it reaches it too)
    try:
        process = subprocess.Popen([executable, *argv, *args.agent_args], env={**os.environ, **env})
        try:
            return process.wait()
        except BaseException:  # launch killed: the agent gets a SIGTERM it can restore the terminal on
            _stop(process, grace_s=5)
            raise
    finally:
        signal.signal(signal.SIGINT, previous)


def _chosen(base_url: str, served: tuple[str, int | None], args: argparse.Namespace) -> tuple[str, int | None]:
    """The model the agent is given: the one asked for where the server serves it (a server of several
    models), else the server's own; the key is checked on the way (an agent given a wrong one only
    ever sees 401s)."""
    listed = _listed_models(base_url, args.api_key)
    if args.model is None or args.model == served[0]:
        return served
    if args.model in listed:
        return args.model, None  # (its context is the router's to know; /health tells the default model's)
    print(f"runner: the server on {base_url} serves {', '.join(listed)}, not {args.model}; using {served[0]}",
          file=sys.stderr)
    return served


def _listed_models(base_url: str, key: str | None) -> list[str]:
    request = urllib.request.Request(f"{base_url}/v1/models",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return [m["id"] for m in json.loads(reply.read())["data"]]
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            wanted = "takes another API key than the one given" if key else \
                f"wants an API key: pass --api-key or set {API_KEY_ENV}"
            raise RunnerError(f"the server on {base_url} {wanted}") from None
        raise RunnerError(f"the server on {base_url} answered {exc.code} to /v1/models") from None
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
        raise RunnerError(f"the server on {base_url} lists no models ({exc})") from None


def _served_model(base_url: str, key: str | None) -> tuple[str, int | None] | None:
    """(model, tokens per slot) of the runner server at base_url; None when nothing answers there."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as reply:
            health = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if health.get("status") != "ok":
        return None
    if isinstance(health.get("model"), str):
        return health["model"], health.get("slot_context")
    request = urllib.request.Request(f"{base_url}/v1/models",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:  # another OpenAI-compatible server: its first model
        with urllib.request.urlopen(request, timeout=5) as reply:
            return json.loads(reply.read())["data"][0]["id"], None
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        raise RunnerError(f"a server answers on {base_url} but lists no model ({exc}); pass --api-key, or "
                          "another --port") from None


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], Path]:
    """`runner serve` in its own session (the terminal's Ctrl-C is the agent's), its output in a
    log file (it would scramble the agent's screen)."""
    from runner.catalog.embedded import is_frozen

    runner = [sys.executable] if is_frozen() else [sys.executable, "-m", "runner"]
    model = args.model or "gemma-3-270m"
    fd, name = tempfile.mkstemp(prefix=f"runner-launch-{args.port}-", suffix=".log")  # (a new file: no link followed)
    log = Path(name)
    flags = to_flags(from_args(EngineOptions, args), unless_as=EngineOptions())  # (what serve's defaults would not give)
    print(f"runner: no server on {args.host}:{args.port}; starting `runner serve {shlex.join([model, *flags])}` "
          f"(log: {log})", file=sys.stderr)
    env = {**os.environ, API_KEY_ENV: args.api_key} if args.api_key else None  # the key the agent is given
    with os.fdopen(fd, "wb") as out:
        server = subprocess.Popen([*runner, "serve", model, "--host", args.host, "--port", str(args.port), *flags,
                                   "--log-requests", "--with-parent"],
                                  stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True, env=env)
    return server, log


def _wait_until_serving(base_url: str, server: subprocess.Popen[bytes], log: Path) -> tuple[str, int | None]:
    """Poll until the started server answers (a first pull and load may take minutes)."""
    while True:
        served = _served_model(base_url, None)
        if served is not None:
            return served
        if server.poll() is not None:
            last = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise RunnerError(f"the server did not start (exit status {server.returncode}): {last[0]}")
        time.sleep(0.25)
