"""`runner ps`: what a running server has loaded, since when, its memory and keep-alive left."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import time
import urllib.error
import urllib.request

from runner.config.options import PORT
from runner.core.errors import RunnerError

API_KEY_ENV = "RUNNER_API_KEY"


def add_ps_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="the server's address (default 127.0.0.1)")
    p.add_argument("--port", type=PORT, default=8080, help="the server's port (default 8080)")
    p.add_argument("--api-key", default=None, help=f"the server's key (default: ${API_KEY_ENV})")
    p.add_argument("--all", action="store_true", help="every servable model, not only the loaded ones")


def cmd_ps(args: argparse.Namespace) -> int:
    base = f"http://{args.host}:{args.port}"
    key = args.api_key or os.environ.get(API_KEY_ENV)
    models = _get(base, "/models", key)
    if models is None:  # a server of one model: it is loaded while it answers
        listed = _get(base, "/v1/models", key)
        if listed is None:
            raise RunnerError(f"the server on {base} is not a runner server (no /models, no /v1/models)")
        models = {"data": [{"id": m["id"], "status": {"value": "loaded"}} for m in listed["data"][:1]]}
    rows = [m for m in models["data"] if args.all or m["status"]["value"] != "unloaded"]
    if not rows:
        print(f"no model loaded on {base}")
        return 0
    width = max(5, *(len(m["id"]) for m in rows))
    print(f"{'MODEL':{width}}  {'STATE':8}  {'SINCE':>9}  {'MEMORY':>9}  {'REQUESTS':>8}  UNLOADS IN")
    for m in rows:
        print(f"{m['id']:{width}}  {m['status']['value']:8}  {_since(m.get('loaded_at')):>9}  "
              f"{_mib(m.get('memory_bytes')):>9}  {m.get('requests_in_flight', 0):>8}  {_left(m)}")
    return 0


def _get(base: str, path: str, key: str | None) -> dict | None:
    """The JSON answer to GET path (None: a 404)."""
    try:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {key}"} if key else {})
        with urllib.request.urlopen(request, timeout=5) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        if exc.code == 401:
            wanted = "takes another API key than the one given" if key else \
                f"wants an API key: pass --api-key or set {API_KEY_ENV}"
            raise RunnerError(f"the server on {base} {wanted}") from None
        raise RunnerError(f"the server on {base} answered {exc.code} to {path}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RunnerError(f"no runner server answers on {base} ({getattr(exc, 'reason', exc)}); start one with "
                          "`runner serve`, or pass --port") from None
    except (ValueError, http.client.HTTPException) as exc:  # a malformed host or key, an answer not JSON
        raise RunnerError(f"cannot ask {base}{path}: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise RunnerError(f"the server on {base} is not a runner server (its {path} has no model list)")
    return body


def _since(loaded_at: float | None) -> str:
    if not loaded_at:
        return "-"
    return _duration(max(0.0, time.time() - loaded_at)) + " ago"


def _left(model: dict) -> str:
    if model["status"]["value"] != "loaded":
        return "-"
    if model.get("requests_in_flight"):
        return "busy"
    left = model.get("expires_in_s")
    return "never" if left is None else _duration(left)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _mib(n_bytes: int | None) -> str:
    return "-" if not n_bytes else f"{n_bytes / (1 << 20):,.0f} MiB"
