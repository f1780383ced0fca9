"""Models from the Hugging Face Hub: `hf.co/ORG/REPO[:QUANT][@REVISION]` and
`hf.co/ORG/REPO/FILE.gguf[@REVISION]`, downloaded with huggingface_hub (the Hub's own client:
resume, HF_TOKEN, HF_ENDPOINT) into runner's own cache, sha256-verified before a file is visible.

Runner's cache, not the user's HF cache: the HF cache keeps blobs behind symlinks and checks no
checksum; here a file is in the cache only once it matched the sha256 the Hub reported, `runner
list/rm` see everything, and the one-file executable needs nothing else. The layout:

    $RUNNER_CACHE_DIR/hf/ORG/REPO/refs/REVISION      the commit a branch or tag pointed to when pulled
    $RUNNER_CACHE_DIR/hf/ORG/REPO/COMMIT/files.json  the repo's GGUF listing then (names, sizes, sha256)
    $RUNNER_CACHE_DIR/hf/ORG/REPO/COMMIT/FILE.gguf   verified files
    $RUNNER_CACHE_DIR/hf/ORG/REPO/.download/COMMIT/  partial downloads, resumed by the next pull

A reference that is cached loads without any network call (run, chat, serve); `runner pull` asks
the Hub again unless HF_HUB_OFFLINE=1 or the network is down, and then says it uses the cache.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import PullError

PREFIXES = ("https://huggingface.co/", "https://hf.co/", "huggingface.co/", "hf.co/")
_REF = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+?)(?:/(?P<file>[^@:]+\.gguf))?(?:@(?P<rev1>[^:@]+))?"
                  r"(?::(?P<quant>[^@:/]+))?(?:@(?P<rev2>[^:@]+))?$")
_BROWSER_URL = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<file>.+\.gguf)$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# a quant tag in a file name: Q4_K_M, IQ3_XXS, Q8_0, F16, BF16, ... (the last one in the name)
_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?|TQ\d_\d)(?![A-Za-z0-9])",
                    re.IGNORECASE)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 1 << 20
_CONNECT_CHECK_S = 5.0  # how long search waits to see that the Hub answers at all


@dataclass(frozen=True)
class HubRef:
    """A Hub model reference, as typed."""

    repo: str  # ORG/REPO
    quant: str | None = None  # a quant tag to pick (case-insensitive)
    file: str | None = None  # or an exact .gguf path in the repo
    revision: str | None = None  # a branch, tag or commit (default: main)

    @property
    def text(self) -> str:
        out = f"hf.co/{self.repo}" + (f"/{self.file}" if self.file else "") + (f":{self.quant}" if self.quant else "")
        return out + (f"@{self.revision}" if self.revision else "")


def parse_hub_ref(text: str) -> HubRef | None:
    """The reference, or None when `text` does not name the Hub; a malformed one is a PullError."""
    rest = next((text[len(p):] for p in PREFIXES if text.lower().startswith(p)), None)
    if rest is None:
        return None
    rest = rest.split("?", 1)[0]
    browser = _BROWSER_URL.match(rest.strip("/"))  # a file's page or download link, as copied from the Hub
    if browser is not None:
        rest = f"{browser['repo']}/{browser['file']}@{browser['rev']}"
    match = _REF.match(rest.strip("/"))
    if match is None or (match["rev1"] and match["rev2"]) or (match["file"] and match["quant"]):
        raise PullError(f"cannot read the Hub reference '{text}': write hf.co/ORG/REPO[:QUANT][@REVISION] "
                        "or hf.co/ORG/REPO/FILE.gguf[@REVISION]")
    return HubRef(match["repo"], match["quant"], match["file"], match["rev1"] or match["rev2"])


@dataclass(frozen=True)
class HubFile:
    name: str  # its path in the repo
    size: int
    sha256: str | None  # as the Hub reports it for LFS files

    def json(self) -> dict:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


def quant_tag(name: str) -> str | None:
    """The quant a GGUF's file name says (upper case), e.g. 'Q4_K_M' for 'Llama-3.2-1B-Q4_K_M.gguf'."""
    stem = _SPLIT.sub(".gguf", Path(name).name).removesuffix(".gguf").removesuffix(".GGUF")
    tags = _QUANT.findall(stem)
    return tags[-1].upper() if tags else None


def _models(files: list[HubFile]) -> list[tuple[HubFile, ...]]:
    """The repo's GGUF models: a file, or the parts of a split in order (projectors and EAGLE3 heads left out)."""
    singles: list[tuple[HubFile, ...]] = []
    splits: dict[str, list[HubFile]] = {}
    for f in files:
        if not f.name.lower().endswith(".gguf") or is_companion(f.name):
            continue
        split = _SPLIT.search(f.name)
        if split:
            splits.setdefault(f.name[: split.start()], []).append(f)
        else:
            singles.append((f,))
    for parts in splits.values():
        parts.sort(key=lambda f: f.name)
        singles.append(tuple(parts))
    return sorted(singles, key=lambda parts: parts[0].name)


def choose(ref: HubRef, files: list[HubFile]) -> tuple[HubFile, ...]:
    """The file (or split parts) a reference means; a PullError that lists what exists otherwise."""
    models = _models(files)
    if not models:
        raise PullError(f"{ref.repo} has no .gguf file (is it a GGUF repository?)")
    if ref.file:
        for parts in models:
            if ref.file in (p.name for p in parts):
                return parts
        names = ", ".join(p[0].name for p in models)
        raise PullError(f"{ref.repo} has no file {ref.file}; its GGUF files: {names}")
    tags = {parts: quant_tag(parts[0].name) for parts in models}
    if ref.quant:
        found = [parts for parts, tag in tags.items() if tag == ref.quant.upper()]
        if not found:
            known = ", ".join(sorted({t for t in tags.values() if t})) or "none tagged"
            raise PullError(f"{ref.repo} has no {ref.quant.upper()} file; quants there: {known}")
        return min(found, key=_size)
    for parts, tag in tags.items():
        if tag == "Q4_K_M":
            return parts
    q4 = [parts for parts, tag in tags.items() if tag and tag.startswith("Q4")]
    if q4:
        return min(q4, key=_size)
    if len(models) == 1:
        return models[0]
    known = ", ".join(sorted({t for t in tags.values() if t})) or ", ".join(p[0].name for p in models)
    raise PullError(f"{ref.repo} has several GGUF files and no Q4 one; pick one with :QUANT ({known})")


def is_projector(name: str) -> bool:
    """A vision (or audio) projector: an mmproj GGUF, loaded beside a model, never served alone."""
    return name.lower().endswith(".gguf") and "mmproj" in Path(name).name.lower()


def is_eagle3_head(name: str) -> bool:
    """An EAGLE3 draft head published beside its target (eagle3-*.gguf): drafts for it, never served alone."""
    return name.lower().endswith(".gguf") and Path(name).name.lower().startswith("eagle3")


def is_companion(name: str) -> bool:
    """A file that goes with a repo's model rather than being one: a projector, an EAGLE3 head."""
    return is_projector(name) or is_eagle3_head(name)


def choose_projector(model: tuple[HubFile, ...], files: list[HubFile]) -> HubFile | None:
    """The repo's projector for this model: the one of the model's own quant where there are
    several, else F16 (llama.cpp's usual projector precision), else the smallest; None: no projector."""
    return _choose_companion(model, [f for f in files if is_projector(f.name)])


def choose_eagle3_head(model: tuple[HubFile, ...], files: list[HubFile]) -> HubFile | None:
    """The repo's EAGLE3 head for this model, chosen as a projector is."""
    return _choose_companion(model, [f for f in files if is_eagle3_head(f.name)])


def _choose_companion(model: tuple[HubFile, ...], found: list[HubFile]) -> HubFile | None:
    if not found:
        return None
    by_tag = {quant_tag(f.name): f for f in sorted(found, key=lambda f: f.size, reverse=True)}
    return by_tag.get(quant_tag(model[0].name)) or by_tag.get("F16") or min(found, key=lambda f: f.size)


def _size(parts: tuple[HubFile, ...]) -> int:
    return sum(p.size for p in parts)


class HubCache:
    """runner's cache of Hub files (the layout in the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root / "hf"

    def repo_dir(self, repo: str) -> Path:
        return self.root / repo

    def forget_empty(self, repo: str) -> None:
        """After a removal: a commit folder left without a model goes (its listing with it), and a
        repository left without one goes whole (its refs, what a download left)."""
        repo_dir = self.repo_dir(repo)
        downloading = repo_dir / ".download"  # (a pull under way or one to resume: its commit stays)
        _remove_empty(downloading)
        commits = [d for d in repo_dir.glob("*") if d.is_dir() and _COMMIT.match(d.name)]
        for commit_dir in commits:
            if not any(commit_dir.rglob("*.gguf")) and not (downloading / commit_dir.name).exists():
                shutil.rmtree(commit_dir, ignore_errors=True)
        if not any(d.exists() for d in commits) and not downloading.exists():
            shutil.rmtree(repo_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                repo_dir.parent.rmdir()  # its organisation's folder, when it was the last repo there

    def commit_of(self, ref: HubRef) -> str | None:
        revision = ref.revision or "main"
        if _COMMIT.match(revision):
            return revision
        try:
            return (self.repo_dir(ref.repo) / "refs" / revision).read_text().strip() or None
        except OSError:
            return None

    def listing(self, repo: str, commit: str) -> list[HubFile] | None:
        try:
            raw = json.loads((self.repo_dir(repo) / commit / "files.json").read_text())
            return [HubFile(f["name"], int(f["size"]), f.get("sha256")) for f in raw]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def remember(self, ref: HubRef, commit: str, files: list[HubFile]) -> None:
        folder = self.repo_dir(ref.repo) / commit
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(folder / "files.json", json.dumps([f.json() for f in files], indent=1))
        if ref.revision != commit:
            (self.repo_dir(ref.repo) / "refs").mkdir(exist_ok=True)
            _write_atomic(self.repo_dir(ref.repo) / "refs" / (ref.revision or "main"), commit)

    def path(self, repo: str, commit: str, name: str) -> Path:
        return self.repo_dir(repo) / commit / name

    def cached(self, ref: HubRef) -> Path | None:
        """The first file of what `ref` means, when all of it is in the cache (no network)."""
        parts = self.cached_parts(ref)
        return parts[0] if parts else None

    def cached_parts(self, ref: HubRef) -> list[Path] | None:
        """Every file (split parts in order) of what `ref` means, when all are in the cache."""
        commit = self.commit_of(ref)
        listing = self.listing(ref.repo, commit) if commit else None
        if commit is None or listing is None:
            return None
        try:
            parts = choose(ref, listing)
        except PullError:
            return None
        paths = [self.path(ref.repo, commit, p.name) for p in parts]
        return paths if all(p.exists() for p in paths) else None

    def interrupted_download(self, ref: HubRef) -> list[Path]:
        """What an interrupted pull of what `ref` means left, for `runner rm`: its finished parts,
        its partial file and that file's lock (none: no such pull; PullError: a pull is writing it)."""
        commit = self.commit_of(ref)
        listing = self.listing(ref.repo, commit) if commit else None
        if commit is None or listing is None:
            return []
        try:
            parts = choose(ref, listing)
        except PullError:
            return []
        staging = self.repo_dir(ref.repo) / ".download" / commit
        partials = [f for f in (staging / (p.name + ".partial") for p in parts) if f.exists()]
        if not partials:
            return []
        for partial in partials:
            _check_no_pull_writes(partial, ref)
        finished = [f for f in (self.path(ref.repo, commit, p.name) for p in parts) if f.exists()]
        locks = [f for f in (p.with_name(p.name + ".lock") for p in partials) if f.exists()]
        return finished + partials + locks

    def projector(self, ref: HubRef) -> Path | None:
        """The cached projector of what `ref` means (None: its repo has none, or it is not cached)."""
        return self._companion(ref, choose_projector)

    def eagle3_head(self, ref: HubRef) -> Path | None:
        """The cached EAGLE3 head its repo publishes for what `ref` means (None: none, or not cached)."""
        return self._companion(ref, choose_eagle3_head)

    def _companion(self, ref: HubRef, chooser: Callable[[tuple[HubFile, ...], list[HubFile]], HubFile | None]
                   ) -> Path | None:
        commit = self.commit_of(ref)
        listing = self.listing(ref.repo, commit) if commit else None
        if commit is None or listing is None:
            return None
        try:
            chosen = chooser(choose(ref, listing), listing)
        except PullError:
            return None
        path = self.path(ref.repo, commit, chosen.name) if chosen else None
        return path if path is not None and path.exists() else None

    def files(self) -> list[tuple[str, list[Path]]]:
        """Every cached Hub model as (the name that loads and removes it, its files): hf.co/ORG/REPO/FILE,
        with @COMMIT where it is not the commit main points to; a split model once, named by its first
        part; projectors and draft heads are not models."""
        out = []
        for commit_dir in sorted(self.root.glob("*/*/*")):
            if not commit_dir.is_dir() or not _COMMIT.match(commit_dir.name):
                continue
            org, repo = commit_dir.parts[-3], commit_dir.parts[-2]
            on_main = self.commit_of(HubRef(f"{org}/{repo}")) == commit_dir.name
            for path in sorted(commit_dir.rglob("*.gguf")):
                split = _SPLIT.search(path.name)
                if is_companion(path.name) or (split and int(split[1]) != 1):
                    continue
                parts = [path]
                if split:
                    stem = path.name[: split.start()]
                    parts = [path.with_name(f"{stem}-{i:05d}-of-{split[2]}.gguf") for i in range(1, int(split[2]) + 1)]
                if not all(p.exists() for p in parts):  # a split whose pull stopped midway: not a model yet
                    continue
                name = f"hf.co/{org}/{repo}/{path.relative_to(commit_dir).as_posix()}"
                out.append((name if on_main else f"{name}@{commit_dir.name}", parts))
        return out


def _write_atomic(path: Path, text: str) -> None:
    """path holds text (written whole or not at all; left as it is when it already does)."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def resolve(ref: HubRef, root: Path, refresh: bool = False, quiet: bool = False) -> Path:
    """The local path of what `ref` means (the first part of a split), downloading what is missing.

    Without `refresh` a cached reference is used as it is, with no network call; with it (`runner
    pull`) the Hub is asked again unless offline or unreachable."""
    log = (lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr))
    cache = HubCache(root)
    cached = cache.cached(ref)
    if cached is not None and (not refresh or is_offline()):
        if refresh:
            log(f"using cached {ref.text} (HF_HUB_OFFLINE is set)")
        return cached
    if is_offline():
        raise PullError(f"{ref.text} is not in the cache and HF_HUB_OFFLINE is set; pull it while online first")
    try:
        commit, listing = _ask_hub(ref)
    except PullError as exc:
        if cached is not None and str(exc).startswith("no network"):
            log(f"using cached {ref.text} (the Hub at {endpoint()} is unreachable)")
            return cached
        raise
    parts = choose(ref, listing)
    try:
        cache.remember(ref, commit, listing)
        paths = [_download(ref, commit, part, cache, quiet) for part in parts]
        for companion in (choose_projector(parts, listing), choose_eagle3_head(parts, listing)):
            if companion is not None:  # a vision model's projector, a published EAGLE3 head: they come with it
                _download(ref, commit, companion, cache, quiet)
    except OSError as exc:  # the cache cannot be written (read-only, full) outside a download's own errors
        raise PullError(f"cannot write to the model cache ({root}): {exc.strerror or exc}; free space, or set "
                        "RUNNER_CACHE_DIR to a writable folder") from None
    return paths[0]


@dataclass(frozen=True)
class Found:
    """One search hit: a GGUF repository, its downloads, and its quants with their sizes."""

    repo: str
    downloads: int
    quants: list[tuple[str, int]]


def search(text: str, limit: int = 10) -> list[Found]:
    """The Hub's GGUF repositories matching `text`, most downloaded first, with their quants."""
    from huggingface_hub import HfApi

    if is_offline():
        raise PullError("searching needs the Hub, and HF_HUB_OFFLINE is set")
    if not text.strip():
        raise PullError("nothing to search for: give a few words of the model's name")
    if limit < 1:
        raise PullError(f"--limit must be at least 1, got {limit}")
    _check_reachable(endpoint())
    api = HfApi(endpoint=endpoint(), token=_token())
    ref = HubRef(text)
    try:
        hits = list(api.list_models(search=text, filter="gguf", sort="downloads", limit=limit))
    except Exception as exc:  # noqa: BLE001
        raise _readable_hub_error(exc, ref, "search the Hub for") from None
    found = []
    for hit in hits:
        try:
            _, files = _ask_hub(HubRef(hit.id))
        except PullError:
            files = []
        quants = sorted(((quant_tag(parts[0].name) or Path(parts[0].name).stem, _size(parts))
                         for parts in _models(files)), key=lambda q: q[1])
        found.append(Found(hit.id, int(getattr(hit, "downloads", 0) or 0), quants))
    return found


def _check_reachable(url_text: str) -> None:
    """PullError at once when the Hub cannot be reached (huggingface_hub retries a listing for 24 s
    when offline); not checked through a proxy, which only the proxy can tell."""
    import urllib.request

    url = urllib.parse.urlsplit(url_text)
    if urllib.request.getproxies().get(url.scheme):
        return
    try:
        socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=_CONNECT_CHECK_S).close()
    except OSError as exc:
        raise PullError(f"no network: cannot reach {url_text} ({exc.strerror or type(exc).__name__}); "
                        "searching needs the Hub") from None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _ask_hub(ref: HubRef) -> tuple[str, list[HubFile]]:
    """(commit, the repo's files with sizes and sha256) at the reference's revision."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint(), token=_token()).model_info(ref.repo, revision=ref.revision,
                                                                      files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one readable line
        raise _readable_hub_error(exc, ref) from None
    files = []
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        sha256 = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
        size = sibling.size if sibling.size is not None else (lfs.get("size", 0) if isinstance(lfs, dict) else 0)
        files.append(HubFile(sibling.rfilename, int(size or 0), sha256))
    if not info.sha:
        raise PullError(f"the Hub gave no commit for {ref.repo}")
    return info.sha, files


def _readable_hub_error(exc: Exception, ref: HubRef, doing: str = "pull") -> PullError:
    from huggingface_hub import errors

    where = endpoint()
    if isinstance(exc, errors.GatedRepoError) or (
            isinstance(exc, errors.HfHubHTTPError) and exc.response is not None
            and exc.response.status_code in (401, 403) and not isinstance(exc, errors.RepositoryNotFoundError)):
        how = "your HF_TOKEN's account has no access yet" if _token() else "set HF_TOKEN to a token of that account"
        return PullError(f"{ref.repo} is gated: accept its terms on https://huggingface.co/{ref.repo}, then "
                         f"{how} (https://huggingface.co/settings/tokens)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return PullError(f"repository {ref.repo} not found on {where} (a private one needs HF_TOKEN)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return PullError(f"{ref.repo} has no revision '{ref.revision}'")
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return PullError(f"the Hub answered HTTP {status} for {ref.repo}")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return PullError(f"disk full while downloading {ref.text}; free space or set RUNNER_CACHE_DIR to another disk")
    if isinstance(exc, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)) or _is_network(exc):
        return PullError(f"no network: cannot reach {where} ({type(exc).__name__}); a model pulled before "
                         "loads offline, and HF_HUB_OFFLINE=1 skips the Hub")
    return PullError(f"could not {doing} {ref.text}: {type(exc).__name__}: {exc}")


def _is_network(exc: BaseException) -> bool:
    """Whether the network failed somewhere along exc's causes: a name that did not resolve (the usual
    offline case), a refused or timed-out connection, or httpx's transport errors (huggingface_hub 2
    raises those of its own copy, httpx2)."""
    while exc is not None:
        if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror)) or any(
                c.__name__ == "TransportError" and c.__module__.startswith("httpx") for c in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def _download(ref: HubRef, commit: str, part: HubFile, cache: HubCache, quiet: bool) -> Path:
    """One file into the cache, visible only once its sha256 matched. The bytes go to a partial file
    of runner's own in .download/COMMIT/ (huggingface_hub's own download deletes its partial file
    when interrupted): a killed pull leaves it, and the next one asks only for the rest (HTTP Range)."""
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    target = cache.path(ref.repo, commit, part.name)
    if target.exists():
        return target
    staging = cache.repo_dir(ref.repo) / ".download" / commit
    partial = staging / (part.name + ".partial")
    if quiet or not sys.stderr.isatty():
        disable_progress_bars()
    else:
        enable_progress_bars()
    try:
        with _only_download_of(partial):
            if target.exists():  # another pull finished it while this one waited
                return target
            _fetch_into(partial, ref, commit, part)
            digest = _sha256(partial)
            if part.sha256 and digest != part.sha256.lower():
                partial.unlink()
                raise PullError(f"sha256 mismatch for {part.name}: the Hub says {part.sha256}, the download has "
                                f"{digest}; file discarded")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial, target)
    finally:
        _remove_empty(staging.parent)
    return target


def _fetch_into(partial: Path, ref: HubRef, commit: str, part: HubFile) -> None:
    """Append the rest of `part` to the partial file (HTTP Range from its size)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    try:
        url = hf_hub_url(ref.repo, part.name, revision=commit, endpoint=endpoint())
        meta = get_hf_file_metadata(url, token=_token(), endpoint=endpoint())  # follows the Hub's redirects
        with partial.open("ab") as fh:
            http_get(meta.location, fh, resume_size=fh.tell(), headers=build_hf_headers(token=_token()),
                     expected_size=meta.size or part.size or None, displayed_filename=Path(part.name).name)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the partial download is kept; `runner pull {ref.text}` resumes it", file=sys.stderr)
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes one readable line
        n_kept = partial.stat().st_size if partial.exists() else 0
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise PullError(f"disk full while downloading {ref.text} ({n_kept / 1e6:.1f} of {part.size / 1e6:.1f} MB "
                            f"came); free space and `runner pull {ref.text}` resumes it, or `runner rm {ref.text}` "
                            "removes what came (RUNNER_CACHE_DIR puts the cache on another disk)") from None
        if n_kept and _is_network(exc):  # the Hub answered, then the transfer stalled or was cut
            raise PullError(f"the download of {part.name} stopped at {n_kept / 1e6:.1f} of {part.size / 1e6:.1f} MB "
                            f"({type(exc).__name__}); what came is kept: `runner pull {ref.text}` resumes it") from None
        raise _readable_hub_error(exc, ref) from None


@contextlib.contextmanager
def _only_download_of(partial: Path) -> Iterator[None]:
    """One process appends to a partial file at a time (a second pull waits, then finds the file).
    The holder removes the lock file when nothing is left to resume; a waiter that then holds the
    lock of a removed file takes the new one instead."""
    import fcntl  # NOTE: POSIX only, as the PyPI pull's lock

    lock_path = partial.with_name(partial.name + ".lock")
    while True:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock = lock_path.open("w")
        except FileNotFoundError:  # its folder went (a finished pull tidied it) between the two calls
            continue
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.fstat(lock.fileno()).st_ino == lock_path.stat().st_ino:
                break
        except FileNotFoundError:
            pass
        lock.close()
    try:
        yield
    finally:
        if not partial.exists():  # done or discarded: nothing for a later pull to resume
            lock_path.unlink(missing_ok=True)
        lock.close()


def _check_no_pull_writes(partial: Path, ref: HubRef) -> None:
    """PullError when a pull holds this partial file's lock (it is writing it)."""
    import fcntl

    try:
        lock = partial.with_name(partial.name + ".lock").open("r")
    except OSError:
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PullError(f"a pull of {ref.text} is under way; let it finish or stop it first") from None


def _remove_empty(downloading: Path) -> None:
    """Drop the folders under a repository's .download (and it) that pulls have left empty (one that
    holds another pull's lock or partial file stays)."""
    for folder in sorted((p for p in downloading.rglob("*") if p.is_dir()), reverse=True) + [downloading]:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
