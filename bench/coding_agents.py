"""The real coding agents end to end against runner: `runner launch claude -- -p PROMPT` and
`runner launch codex -- exec PROMPT`, each on its own `runner serve` of the smallest catalog model
whose context holds its prompt (Claude Code: gemma-3-270m at 32k; Codex: SmolLM2 at 8k; --model
and --ctx-size serve one model for both), each completing one turn. Per agent: its version, exit
status, wall time, the requests and tokens the server saw (from /metrics), the share of prompt
tokens the prefix cache served, and the start of the reply.

The agents come from npm (`npm install @anthropic-ai/claude-code @openai/codex`); put their bin
folder on PATH or pass --agents-bin. A small model rambles to the end of its room: replies are
capped (--max-output; Claude Code through CLAUDE_CODE_MAX_OUTPUT_TOKENS, Codex, which sets no
limit, by the server's --max-tokens) so that a turn ends in minutes on a CPU. Codex counts a reply
cut by a limit as a failed turn: it gets a larger cap.

    RUNNER_CACHE_DIR=.cache/models python bench/coding_agents.py [--agents-bin node_modules/.bin]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table  # noqa: E402

PROMPT = "Reply with one word: hello."
SERVED = {"claude": ("gemma-3-270m", 32768, 48), "codex": ("smollm2-135m-instruct", 8192, 1024)}  # model, ctx, cap


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return {name: float(value) for name, value in (line.split() for line in lines if line and not line.startswith("#"))}


def wait_for(base: str, server: subprocess.Popen[bytes]) -> None:
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
                if json.loads(reply.read()).get("status") == "ok":
                    return
        except OSError:
            pass
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode}")
        time.sleep(0.5)


def version(executable: str, env: dict[str, str]) -> str:
    done = subprocess.run([executable, "--version"], capture_output=True, text=True, env=env, timeout=60)
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "?"


def run_agent(name: str, port: int, env: dict[str, str], timeout_s: float, base: str, model: str) -> list[object]:
    agent_args = {"claude": ["-p", PROMPT], "codex": ["exec", "--skip-git-repo-check", PROMPT]}[name]
    before = metrics(base)
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "runner", "launch", name, "--port", str(port), "--", *agent_args],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
        status, out = str(done.returncode), done.stdout.strip() or done.stderr.strip().splitlines()[-1]
    except subprocess.TimeoutExpired:
        status, out = "timeout", ""
    seconds = time.perf_counter() - started
    after = metrics(base)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    cached = delta["runner_prompt_tokens_cached_total"]
    prompt = delta["runner_prompt_tokens_total"] + cached  # computed + reused
    return [name, version(name, env), model, status, f"{seconds:.0f}", int(delta["runner_requests_total"]),
            int(prompt), f"{cached / prompt:.2f}" if prompt else "-", int(delta["runner_generated_tokens_total"]),
            out.replace("\n", " ")[:40]]


def serve_and_run(name: str, model: str, ctx: int, cap: int, env: dict[str, str], timeout_s: float) -> list[object]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "runner", "serve", model, "--port", str(port),
                               "--ctx-size", str(ctx), "--parallel", "2", "--max-tokens", str(cap)], env=env)
    try:
        wait_for(base, server)
        return run_agent(name, port, {**env, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(cap)}, timeout_s, base,
                         f"{model} ({ctx // 1024}k)")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="serve this model for every agent")
    parser.add_argument("--ctx-size", type=int, default=32768, help="with --model: tokens per slot (default 32768)")
    parser.add_argument("--max-output", type=int, default=None, help="tokens per reply (default: 48 for Claude "
                                                                     "Code, 1024 for Codex)")
    parser.add_argument("--agents", nargs="+", default=["claude", "codex"])
    parser.add_argument("--agents-bin", default=None, help="folder holding the claude and codex executables")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per agent (default 900)")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="agents-home-")  # the agents' own config and logs stay out of the user's
    env = {**os.environ, "HOME": home}
    if args.agents_bin:
        env["PATH"] = f"{Path(args.agents_bin).resolve()}{os.pathsep}{env['PATH']}"
    rows = []
    for name in args.agents:
        model, ctx, cap = SERVED[name]
        if args.model:
            model, ctx = args.model, args.ctx_size
        rows.append(serve_and_run(name, model, ctx, args.max_output or cap, env, args.timeout))
    print(f"\nprompt: {PROMPT!r}")
    print_table(["agent", "version", "model", "exit", "seconds", "requests", "prompt tokens", "cached share",
                 "generated", "reply"], rows)


if __name__ == "__main__":
    main()
