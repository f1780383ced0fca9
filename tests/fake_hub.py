"""A local HTTP server speaking the Hugging Face Hub endpoints that huggingface_hub calls to list a
repo and download its files (model info with file metadata, HEAD/GET resolve with ranges), so Hub
references are tested with the real client and no internet."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/?]+))?(?:\?.*)?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>[^?]+)(?:\?.*)?$")


@dataclass
class FakeRepo:
    """Files by revision (a branch or commit name maps to a commit's files)."""

    commits: dict[str, dict[str, bytes]]  # commit sha -> file name -> content
    refs: dict[str, str]  # branch/tag -> commit sha
    gated: bool = False  # downloads need a token
    wrong_sha256: bool = False  # the listing reports a sha256 that no download will match
    downloads: int = 0  # what search reports (0: not listed by search)

    def commit_of(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


@dataclass
class Served:
    method: str
    path: str
    range: str | None
    n_bytes: int


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    log: list[Served] = field(default_factory=list)
    # stall: no byte at or past this offset of a file is sent until `release` (a link that hangs there,
    # whatever Range a retry asks for; a client killed mid-download)
    stall_after: int | None = None
    release: threading.Event = field(default_factory=threading.Event)

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def end_headers(self) -> None:
                # one request per connection: a stopped hub is then unreachable at once (no kept-alive socket)
                self.send_header("Connection", "close")
                self.close_connection = True
                super().end_headers()

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    # NOTE: each answer is logged before it is written: a client that has its answer finds it logged
    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.log.append(Served(h.command, h.path, None, 0))
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        if h.path.startswith("/api/models?"):  # search: repos whose name holds the text, most downloaded first
            query = parse_qs(urlparse(h.path).query)
            text = query.get("search", [""])[0].lower()
            hits = [{"id": name, "modelId": name, "downloads": repo.downloads, "tags": ["gguf"]}
                    for name, repo in self.repos.items() if text in name.lower() and repo.downloads]
            hits.sort(key=lambda hit: -hit["downloads"])
            return self._json(h, hits[: int(query.get("limit", ["1000"])[0])])
        info, resolve = _INFO.match(h.path), _RESOLVE.match(h.path)
        match = info or resolve
        repo = self.repos.get(match["repo"]) if match else None
        if repo is None:
            return self._error(h, 401, "RepoNotFound", "Repository not found")
        commit = repo.commit_of(match["rev"] or "main")
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
        files = repo.commits[commit]
        if info:
            siblings = [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                         "lfs": {"sha256": self._sha256(repo, data), "size": len(data), "pointerSize": 134}}
                        for name, data in files.items()]
            return self._json(h, {"id": match["repo"], "modelId": match["repo"], "sha": commit,
                                  "private": False, "gated": "auto" if repo.gated else False, "siblings": siblings})
        if repo.gated and not h.headers.get("authorization"):
            return self._error(h, 401, "GatedRepo", "Access to this model is restricted")
        data = files.get(match["file"])
        if data is None:
            return self._error(h, 404, "EntryNotFound", "Entry not found")
        self._file(h, data, commit, self._sha256(repo, data), body)

    def _sha256(self, repo: FakeRepo, data: bytes) -> str:
        return "0" * 64 if repo.wrong_sha256 else hashlib.sha256(data).hexdigest()

    def _json(self, h: BaseHTTPRequestHandler, obj: object) -> None:
        raw = json.dumps(obj).encode()
        self.log.append(Served(h.command, h.path, None, len(raw)))
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)

    def _file(self, h: BaseHTTPRequestHandler, data: bytes, commit: str, sha256: str, body: bool) -> None:
        wanted = h.headers.get("range")
        start = int(re.match(r"bytes=(\d+)-", wanted)[1]) if wanted else 0
        part = data[start:]
        stall = body and self.stall_after is not None and len(data) > self.stall_after
        sent = part[: max(0, self.stall_after - start)] if stall else part
        self.log.append(Served(h.command, h.path, wanted, len(sent) if body else 0))
        h.send_response(206 if wanted else 200)
        h.send_header("Content-Length", str(len(part)))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", f'"{sha256}"')
        h.send_header("X-Linked-Etag", f'"{sha256}"')
        h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("X-Repo-Commit", commit)
        if wanted:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if not body:
            return
        if stall:
            h.wfile.write(sent)
            h.wfile.flush()
            self.release.wait()
            return
        h.wfile.write(part)
