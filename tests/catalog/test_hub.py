"""Models from the Hugging Face Hub, against a local server speaking the Hub's endpoints
(tests/fake_hub.py) through the real huggingface_hub client: references, choosing the file,
resume, checksums, offline use, one-line errors, and `runner serve hf.co/...` end to end."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engines import load_tiny
from fake_hub import FakeHub, FakeRepo
from runner.catalog.catalog import Catalog
from runner.catalog.hub import HubFile, HubRef, choose, choose_projector, parse_hub_ref, quant_tag
from runner.catalog.store import ModelStore
from runner.cli.main import main
from runner.core.errors import ModelLoadError, PullError
from server_process import ServerProcess
from tiny_gguf import write_tiny_gguf

MAIN, V1 = "1" * 40, "2" * 40  # two commits of the tiny repo: main, and the tag v1


@pytest.mark.parametrize(("text", "ref"), [
    ("hf.co/org/Repo-GGUF", HubRef("org/Repo-GGUF")),
    ("hf.co/org/Repo-GGUF:q4_k_m", HubRef("org/Repo-GGUF", quant="q4_k_m")),
    ("hf.co/org/Repo-GGUF:Q8_0@v1", HubRef("org/Repo-GGUF", quant="Q8_0", revision="v1")),
    ("hf.co/org/Repo-GGUF@v1:Q8_0", HubRef("org/Repo-GGUF", quant="Q8_0", revision="v1")),
    ("hf.co/org/Repo-GGUF/sub/model.Q2_K.gguf@" + MAIN,
     HubRef("org/Repo-GGUF", file="sub/model.Q2_K.gguf", revision=MAIN)),
    ("https://huggingface.co/org/repo.v2", HubRef("org/repo.v2")),
    # a file's page and its download link, as copied from the Hub's website
    ("https://huggingface.co/org/Repo-GGUF/blob/main/model-Q4_0.gguf",
     HubRef("org/Repo-GGUF", file="model-Q4_0.gguf", revision="main")),
    ("https://huggingface.co/org/Repo-GGUF/resolve/v1/sub/model-Q4_0.gguf?download=true",
     HubRef("org/Repo-GGUF", file="sub/model-Q4_0.gguf", revision="v1")),
    ("smollm2-135m-instruct", None),
    ("models/tiny.gguf", None),
])
def test_references_are_read(text: str, ref: HubRef | None) -> None:
    assert parse_hub_ref(text) == ref


@pytest.mark.parametrize("text", ["hf.co/org", "hf.co/org/repo:Q4:Q8", "hf.co/org/repo/f.gguf:Q4_K_M"])
def test_a_malformed_reference_is_one_line(text: str) -> None:
    with pytest.raises(PullError, match="cannot read the Hub reference"):
        parse_hub_ref(text)


def _files(*names_sizes: tuple[str, int]) -> list[HubFile]:
    return [HubFile(n, s, None) for n, s in names_sizes]


def test_the_file_a_reference_means() -> None:
    listing = _files(("Model-Q8_0.gguf", 80), ("Model-Q4_K_M.gguf", 45), ("Model-Q4_0.gguf", 40),
                     ("Model-IQ3_XXS.gguf", 30), ("mmproj-Model-F16.gguf", 10), ("README.md", 1),
                     ("big/Model-F16-00002-of-00002.gguf", 100), ("big/Model-F16-00001-of-00002.gguf", 100))
    assert [quant_tag(f.name) for f in listing[:5]] == ["Q8_0", "Q4_K_M", "Q4_0", "IQ3_XXS", "F16"]
    assert quant_tag("smollm2-1.7b-instruct.q4_k_m.gguf") == "Q4_K_M"
    pick = lambda **kw: [p.name for p in choose(HubRef("o/r", **kw), listing)]  # noqa: E731
    assert pick() == ["Model-Q4_K_M.gguf"]  # the default quant
    assert pick(quant="iq3_xxs") == ["Model-IQ3_XXS.gguf"]  # case-insensitive
    assert pick(quant="F16") == ["big/Model-F16-00001-of-00002.gguf", "big/Model-F16-00002-of-00002.gguf"]
    assert pick(file="Model-Q4_0.gguf") == ["Model-Q4_0.gguf"]
    no_k_m = [f for f in listing if "K_M" not in f.name]
    assert [p.name for p in choose(HubRef("o/r"), no_k_m)] == ["Model-Q4_0.gguf"]  # else the smallest Q4
    only = _files(("weird-name.gguf", 5), ("mmproj.gguf", 1))
    assert [p.name for p in choose(HubRef("o/r"), only)] == ["weird-name.gguf"]  # else the only GGUF
    with pytest.raises(PullError, match=r"o/r has no Q5_K_M file; quants there: F16, IQ3_XXS, Q4_0, Q4_K_M, Q8_0"):
        choose(HubRef("o/r", quant="Q5_K_M"), listing)
    with pytest.raises(PullError, match=r"o/r has no \.gguf file"):
        choose(HubRef("o/r"), _files(("model.safetensors", 9)))


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("hubfiles")
    split = write_tiny_gguf(tmp / "split" / "tiny-F32.gguf", seed=3, split_max_tensors=8)
    parts = sorted(split.parent.glob("*.gguf"))
    return {"q4": write_tiny_gguf(tmp / "a.gguf", seed=1).read_bytes(),
            "q8": write_tiny_gguf(tmp / "b.gguf", seed=2).read_bytes(),
            "odd": write_tiny_gguf(tmp / "odd.gguf", extra_tokens=("zzz",)).read_bytes(),
            **{f"split{i}": p.read_bytes() for i, p in enumerate(parts, 1)},
            "n_parts": str(len(parts)).encode()}


@pytest.fixture
def fake_hub(tiny_files: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    n = int(tiny_files["n_parts"])
    split = {f"tiny-F32-{i:05d}-of-{n:05d}.gguf": tiny_files[f"split{i}"] for i in range(1, n + 1)}
    fake = FakeHub({
        "org/tiny-GGUF": FakeRepo({MAIN: {"tiny-Q4_K_M.gguf": tiny_files["q4"], "tiny-Q8_0.gguf": tiny_files["q8"],
                                          **split, "README.md": b"# tiny"},
                                   V1: {"tiny-Q8_0.gguf": tiny_files["q8"]}}, {"main": MAIN, "v1": V1},
                                  downloads=900),
        "org/odd-GGUF": FakeRepo({MAIN: {"odd-Q4_0.gguf": tiny_files["odd"]}}, {"main": MAIN}, downloads=1200),
        "org/gated-GGUF": FakeRepo({MAIN: {"g-Q4_0.gguf": tiny_files["q4"]}}, {"main": MAIN}, gated=True),
        "org/corrupt-GGUF": FakeRepo({MAIN: {"c-Q4_0.gguf": tiny_files["q4"]}}, {"main": MAIN}, wrong_sha256=True),
        "org/safetensors": FakeRepo({MAIN: {"model.safetensors": b"x" * 10}}, {"main": MAIN}),
        "org/big-GGUF": FakeRepo({MAIN: {"big-Q4_K_M.gguf": os.urandom(24 << 20)}}, {"main": MAIN}),
    })
    url = fake.start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield fake
    fake.stop()


def _downloads(fake: FakeHub) -> list[str]:
    return [s.path.rsplit("/", 1)[-1] for s in fake.log if s.method == "GET" and "/resolve/" in s.path]


def test_pull_by_repo_quant_file_and_revision(fake_hub: FakeHub, tiny_files: dict[str, bytes],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    store = ModelStore()
    cache = store.root / "hf" / "org" / "tiny-GGUF"
    assert main(["pull", "hf.co/org/tiny-GGUF"]) == 0
    assert (cache / MAIN / "tiny-Q4_K_M.gguf").read_bytes() == tiny_files["q4"]
    assert (cache / "refs" / "main").read_text() == MAIN
    assert main(["pull", "hf.co/org/tiny-GGUF:q8_0"]) == 0
    assert (cache / MAIN / "tiny-Q8_0.gguf").read_bytes() == tiny_files["q8"]
    assert main(["pull", "hf.co/org/tiny-GGUF/tiny-Q8_0.gguf"]) == 0  # the same file: not fetched again
    assert main(["pull", "hf.co/org/tiny-GGUF:Q8_0@v1"]) == 0
    assert (cache / V1 / "tiny-Q8_0.gguf").read_bytes() == tiny_files["q8"]
    assert _downloads(fake_hub) == ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "tiny-Q8_0.gguf"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pulled hf.co/org/tiny-GGUF (") and out[2].startswith("already cached: ")
    assert not list(store.root.rglob("*.partial"))
    listed = [c.name for c in store.cached()]  # one name per model, one that loads and removes it
    assert listed == ["hf.co/org/tiny-GGUF/tiny-Q4_K_M.gguf", "hf.co/org/tiny-GGUF/tiny-Q8_0.gguf",
                      f"hf.co/org/tiny-GGUF/tiny-Q8_0.gguf@{V1}"]  # (v1's had main's name)
    assert main(["rm", listed[2]]) == 0
    assert not (cache / V1 / "tiny-Q8_0.gguf").exists() and (cache / MAIN / "tiny-Q8_0.gguf").exists()
    assert not (cache / V1).exists()  # its listing went with its last model (it stayed, with refs/)
    assert main(["rm", listed[0]]) == 0 and main(["rm", listed[1]]) == 0
    assert not cache.exists()  # the repository's last model: nothing of it is left


def test_a_split_model_is_fetched_whole_and_loaded_from_its_first_part(fake_hub: FakeHub) -> None:
    loaded = load_tiny("hf.co/org/tiny-GGUF:F32", 1)
    try:
        assert loaded.path.name.endswith("-00001-of-00003.gguf") and loaded.name == "hf.co/org/tiny-GGUF:F32"
        assert loaded.info.n_splits == 3
        parts = sorted(loaded.path.parent.glob("tiny-F32-*.gguf"))
        assert loaded.info.weights_bytes == sum(p.stat().st_size for p in parts) > loaded.info.file_size
        ids = loaded.text_prompt_ids("the cat")
        assert ids and loaded.model.n_vocab == 264
    finally:
        loaded.close()
    assert sorted(_downloads(fake_hub)) == [f"tiny-F32-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    (listed,) = ModelStore().cached()  # once, not once per part
    assert listed.name == "hf.co/org/tiny-GGUF/tiny-F32-00001-of-00003.gguf"
    assert listed.size_bytes == sum(p.stat().st_size for p in parts)


def test_a_checksum_mismatch_leaves_nothing(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "hf.co/org/corrupt-GGUF"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("runner: error: sha256 mismatch for c-Q4_0.gguf: the Hub says 000") and "\n" not in err
    cache = ModelStore().root
    assert not list(cache.rglob("*.gguf")) and not list(cache.rglob("*.partial"))


def test_a_cached_reference_loads_offline(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["pull", "hf.co/org/tiny-GGUF:Q8_0"]) == 0
    n_requests = len(fake_hub.log)
    store = ModelStore()
    path, _ = store.resolve("hf.co/org/tiny-GGUF:Q8_0")  # cached: no metadata call at all
    assert path.name == "tiny-Q8_0.gguf" and len(fake_hub.log) == n_requests
    fake_hub.stop()  # the network is gone
    assert main(["pull", "hf.co/org/tiny-GGUF:Q8_0"]) == 0
    assert "using cached hf.co/org/tiny-GGUF:Q8_0 (the Hub at http://127.0.0.1:" in capsys.readouterr().err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "hf.co/org/tiny-GGUF:Q8_0"]) == 0
    assert "using cached hf.co/org/tiny-GGUF:Q8_0 (HF_HUB_OFFLINE is set)" in capsys.readouterr().err
    loaded = load_tiny("hf.co/org/tiny-GGUF:Q8_0", 1)
    loaded.close()
    assert main(["pull", "hf.co/org/tiny-GGUF:Q4_K_M"]) == 1
    assert "is not in the cache and HF_HUB_OFFLINE is set" in capsys.readouterr().err


@pytest.mark.parametrize(("ref", "message"), [
    ("hf.co/org/nope-GGUF", "repository org/nope-GGUF not found on http://127.0.0.1:"),
    ("hf.co/org/gated-GGUF", "org/gated-GGUF is gated: accept its terms on https://huggingface.co/org/gated-GGUF, "
                             "then set HF_TOKEN"),
    ("hf.co/org/safetensors", "org/safetensors has no .gguf file"),
    ("hf.co/org/tiny-GGUF:Q5_K_M", "org/tiny-GGUF has no Q5_K_M file; quants there: F32, Q4_K_M, Q8_0"),
    ("hf.co/org/tiny-GGUF@v9", "org/tiny-GGUF has no revision 'v9'"),
])
def test_each_failure_is_one_line(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str], ref: str,
                                  message: str) -> None:
    assert main(["pull", ref]) == 1
    err = capsys.readouterr().err
    assert err.startswith("runner: error: " + message) and err.count("\n") == 1, err


def test_a_gated_repo_pulls_with_hf_token(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    assert main(["pull", "hf.co/org/gated-GGUF"]) == 0
    assert next(ModelStore().root.rglob("g-Q4_0.gguf")).stat().st_size > 0


def test_a_full_disk_is_one_line(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import file_download

    def disk_full(url: str, fh, *args: object, **kwargs: object) -> None:  # type: ignore[no-untyped-def]
        fh.write(b"G" * 300_000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_download, "http_get", disk_full)
    assert main(["pull", "hf.co/org/tiny-GGUF"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("runner: error: disk full while downloading hf.co/org/tiny-GGUF (0.3 of ")
    assert err.count("\n") == 1
    assert "`runner rm hf.co/org/tiny-GGUF` removes what came" in err
    (partial,) = ModelStore().root.rglob("*.partial")
    assert main(["rm", "hf.co/org/tiny-GGUF"]) == 0 and not partial.exists()  # (it was "not in the cache")


def test_search_lists_gguf_repos_with_their_quants(fake_hub: FakeHub, tiny_files: dict[str, bytes],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "GGUF"]) == 0
    lines = capsys.readouterr().out.splitlines()
    q4, q8 = len(tiny_files["q4"]) / 1e9, len(tiny_files["q8"]) / 1e9
    assert lines[0] == "hf.co/org/odd-GGUF  (1,200 downloads)"
    assert lines[2] == "hf.co/org/tiny-GGUF  (900 downloads)"
    assert lines[3].startswith(f"    Q4_K_M {q4:.1f} GB, Q8_0 {q8:.1f} GB, F32 ") and len(lines) == 4


@pytest.mark.parametrize("command", [["pull", "hf.co/org/tiny-GGUF"], ["search", "tiny"]])
def test_no_network_is_one_line(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    fake_hub.stop()  # (connections refused: search said so after huggingface_hub's retries, 23 s)
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.startswith("runner: error: no network: cannot reach http://127.0.0.1:") and err.count("\n") == 1
    assert ("searching needs the Hub" in err) == (command[0] == "search")  # (not "a model pulled before ...")


@pytest.mark.parametrize("command", [["pull", "hf.co/org/tiny-GGUF"], ["search", "tiny"]])
def test_a_name_that_does_not_resolve_is_no_network_at_once(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    """The usual offline case: the Hub's name does not resolve (.invalid never does, RFC 6761); search
    says so before huggingface_hub's retries (24 s)."""
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.startswith("runner: error: no network: cannot reach http://hub.invalid") and err.count("\n") == 1


@pytest.mark.parametrize(("command", "message"), [(["search", " "], "nothing to search for"),
                                                  (["search", "tiny", "--limit", "0"], "--limit must be at least 1")])
def test_search_refuses_no_words_and_no_results_wanted(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str],
                                                        command: list[str], message: str) -> None:
    assert main(command) == 1
    assert capsys.readouterr().err.startswith(f"runner: error: {message}")


def test_a_draft_from_the_hub_with_another_vocabulary_is_refused(fake_hub: FakeHub) -> None:
    with pytest.raises(ModelLoadError, match=r"the draft model odd-Q4_0.gguf has a different vocabulary \(265"):
        load_tiny("hf.co/org/tiny-GGUF", 1, draft="hf.co/org/odd-GGUF", spec="on")


def test_a_catalog_entry_with_a_hub_source(fake_hub: FakeHub, tiny_files: dict[str, bytes]) -> None:
    catalog = Catalog.load("""
        default = "tiny"
        [models.tiny]
        hub = "hf.co/org/tiny-GGUF:Q8_0"
        license = "MIT"
        draft = "tiny-draft"
        [models.tiny-draft]
        hub = "hf.co/org/tiny-GGUF:Q4_K_M"
        license = "MIT"
    """)
    store = ModelStore(catalog)
    path, ref = store.resolve("tiny")
    assert path.read_bytes() == tiny_files["q8"] and ref is not None and ref.name == "tiny"
    assert ref.entry.draft == "tiny-draft" and ref.entry.sha256 == "" and ref.entry.file == ""
    assert store.resolve("tiny-draft")[0].name == "tiny-Q4_K_M.gguf"


def test_the_shipped_catalog_has_hub_models_with_drafts_of_the_same_family() -> None:
    catalog = Catalog.load()
    hub_entries = {name: e for name, e in catalog.entries.items() if e.hub}
    assert len(hub_entries) >= 8
    for name, entry in hub_entries.items():
        assert parse_hub_ref(entry.hub) is not None and entry.license, name
        if entry.draft:
            assert catalog.entries[entry.draft].hub, (name, entry.draft)
    assert catalog.default == "smollm2-135m-instruct" and not catalog.entries[catalog.default].hub


def _pull(*args: str) -> subprocess.Popen[str]:
    # Ctrl-C as a terminal delivers it: a suite started in the background (`cmd &` in a script) hands
    # its children SIGINT ignored, and then the test's Ctrl-C would do nothing
    return subprocess.Popen([sys.executable, "-m", "runner", "pull", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_an_interrupted_pull_resumes_where_it_stopped(fake_hub: FakeHub) -> None:
    size = 24 << 20
    fake_hub.stall_after = 12 << 20  # then the server hangs, as a slow link would
    proc = _pull("hf.co/org/big-GGUF")
    partial_dir = ModelStore().root / "hf" / "org" / "big-GGUF" / ".download"
    deadline = time.time() + 60
    partial: list[Path] = []
    while time.time() < deadline:  # huggingface_hub writes 10 MiB chunks: wait for the first
        partial = [p for p in partial_dir.rglob("*.partial") if p.stat().st_size > 0]
        if partial:
            break
        time.sleep(0.05)
    assert partial, "no partial download appeared"
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode != 0 and "the partial download is kept; `runner pull hf.co/org/big-GGUF` resumes it" in err
    kept = partial[0].stat().st_size
    assert 0 < kept < size and not list(ModelStore().root.rglob("big-Q4_K_M.gguf"))
    fake_hub.stall_after = None
    fake_hub.release.set()
    first = len(fake_hub.log)
    proc = _pull("hf.co/org/big-GGUF")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    gets = [s for s in fake_hub.log[first:] if s.method == "GET" and s.path.endswith("big-Q4_K_M.gguf")]
    assert [s.range for s in gets] == [f"bytes={kept}-"]  # the second pull asked only for the rest
    assert gets[0].n_bytes == size - kept
    final = next(ModelStore().root.rglob("big-Q4_K_M.gguf"))
    assert final.stat().st_size == size and not list(partial_dir.rglob("*.partial"))


def test_serve_a_hub_reference_end_to_end(fake_hub: FakeHub) -> None:
    # the server process inherits HF_ENDPOINT (the fake Hub) from this test's environment
    server = ServerProcess("hf.co/org/tiny-GGUF:Q8_0", ModelStore().root, "--ctx-size", "256")
    try:
        models = server.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["hf.co/org/tiny-GGUF:Q8_0"]
        r = server.post("/v1/completions", json={"model": "hf.co/org/tiny-GGUF:Q8_0", "prompt": "the",
                                                 "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        server.stop()


def test_the_projector_a_vision_model_brings() -> None:
    listing = _files(("vlm-Q8_0.gguf", 80), ("vlm-Q4_K_M.gguf", 45), ("mmproj-vlm-F16.gguf", 20),
                     ("mmproj-vlm-Q8_0.gguf", 10), ("mmproj-vlm-F32.gguf", 40))
    q8, q4 = (listing[0],), (listing[1],)
    assert choose_projector(q8, listing).name == "mmproj-vlm-Q8_0.gguf"  # the model's own quant
    assert choose_projector(q4, listing).name == "mmproj-vlm-F16.gguf"  # else F16
    assert choose_projector(q4, listing[:2] + listing[4:]).name == "mmproj-vlm-F32.gguf"  # else the smallest
    assert choose_projector(q8, listing[:2]) is None


def test_a_vision_model_from_the_hub_comes_with_its_projector(fake_hub: FakeHub, tiny_files: dict[str, bytes],
                                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tiny_mmproj import write_tiny_mmproj

    projector = write_tiny_mmproj(tmp_path / "p.gguf").read_bytes()
    fake_hub.repos["org/vlm-GGUF"] = FakeRepo({MAIN: {"vlm-Q8_0.gguf": tiny_files["q8"],
                                                      "mmproj-vlm-F16.gguf": projector,
                                                      "mmproj-vlm-Q8_0.gguf": projector}}, {"main": MAIN})
    assert main(["pull", "hf.co/org/vlm-GGUF:Q8_0"]) == 0
    store = ModelStore()
    assert store.projector_of("hf.co/org/vlm-GGUF:Q8_0").name == "mmproj-vlm-Q8_0.gguf"
    assert [c.name for c in store.cached()] == ["hf.co/org/vlm-GGUF/vlm-Q8_0.gguf"]  # a projector is no model
    gets = [s.path.rsplit("/", 1)[-1] for s in fake_hub.log if s.method == "GET" and "/resolve/" in s.path]
    assert sorted(gets) == ["mmproj-vlm-Q8_0.gguf", "vlm-Q8_0.gguf"]  # not the F16 one
    loaded = load_tiny("hf.co/org/vlm-GGUF:Q8_0")  # type: ignore[arg-type]
    try:
        assert loaded.facts.takes_images and loaded.mmproj_path == store.projector_of("hf.co/org/vlm-GGUF:Q8_0")
    finally:
        loaded.close()


def test_a_model_from_the_hub_comes_with_the_eagle3_head_its_repo_publishes(
        fake_hub: FakeHub, tmp_path: Path) -> None:
    from tiny_eagle3 import write_tiny_eagle3_gguf

    target = write_tiny_gguf(tmp_path / "t.gguf", n_layer=3).read_bytes()
    head = write_tiny_eagle3_gguf(tmp_path / "h.gguf").read_bytes()
    fake_hub.repos["org/llm3-GGUF"] = FakeRepo({MAIN: {"llm3-Q8_0.gguf": target, "llm3-Q4_0.gguf": target,
                                                       "eagle3-llm3-F16.gguf": head}}, {"main": MAIN})
    assert main(["pull", "hf.co/org/llm3-GGUF:Q8_0"]) == 0
    store = ModelStore()
    assert store.eagle3_head_of("hf.co/org/llm3-GGUF:Q8_0").name == "eagle3-llm3-F16.gguf"
    assert [c.name for c in store.cached()] == ["hf.co/org/llm3-GGUF/llm3-Q8_0.gguf"]  # a head is no model
    loaded = load_tiny("hf.co/org/llm3-GGUF:Q8_0", spec="eagle3")  # type: ignore[arg-type]
    try:
        assert loaded.speculator.drafter.name == "eagle3"
        assert loaded.speculator.drafter.model.path == store.eagle3_head_of("hf.co/org/llm3-GGUF:Q8_0")
    finally:
        loaded.close()
    assert main(["pull", "hf.co/org/llm3-GGUF:Q4_0"]) == 0
    assert [p.name for p in store.remove("hf.co/org/llm3-GGUF:Q8_0")] == ["llm3-Q8_0.gguf"]  # the head serves Q4_0 too
    removed = store.remove("hf.co/org/llm3-GGUF:Q4_0")
    assert sorted(p.name for p in removed) == ["eagle3-llm3-F16.gguf", "llm3-Q4_0.gguf"]


def test_a_finished_pull_leaves_another_pulls_lock_and_folder_in_place(fake_hub: FakeHub) -> None:
    """Two pulls of two files of one commit: the first to finish tidied .download/COMMIT, removing
    the other's lock (taken, its partial file not begun) and then the folder under it."""
    import fcntl

    store = ModelStore()
    staging = store.root / "hf" / "org" / "tiny-GGUF" / ".download" / MAIN
    staging.mkdir(parents=True)
    other_lock = staging / "tiny-Q8_0.gguf.partial.lock"
    with other_lock.open("w") as held:  # the other pull, between its lock and its first byte
        fcntl.flock(held, fcntl.LOCK_EX)
        assert main(["pull", "hf.co/org/tiny-GGUF"]) == 0
        assert other_lock.exists() and os.fstat(held.fileno()).st_ino == other_lock.stat().st_ino
    assert main(["pull", "hf.co/org/tiny-GGUF:Q8_0"]) == 0  # (it takes the lock, finishes and tidies)
    assert not (store.root / "hf" / "org" / "tiny-GGUF" / ".download").exists()


def test_a_cache_that_cannot_be_written_is_one_line(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["pull", "hf.co/org/tiny-GGUF"]) == 0
    real_unlink = Path.unlink

    def read_only(path: Path, missing_ok: bool = False) -> None:  # what a read-only mount answers
        if path.suffix == ".gguf":
            raise OSError(errno.EROFS, "Read-only file system")
        real_unlink(path, missing_ok)

    monkeypatch.setattr(Path, "unlink", read_only)
    assert main(["rm", "hf.co/org/tiny-GGUF"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("runner: error: cannot remove ") and err.endswith("Read-only file system")
    monkeypatch.setattr(Path, "write_text", lambda *a, **k: _read_only())
    assert main(["pull", "hf.co/org/tiny-GGUF"]) == 0  # cached, its listing unchanged: nothing to write
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda path, mode="r", *a, **k: (
        _read_only() if "w" in mode or "a" in mode else real_open(path, mode, *a, **k)))
    assert main(["pull", "hf.co/org/tiny-GGUF:Q8_0"]) == 1
    err = capsys.readouterr().err.strip()
    assert "cannot write to the model cache" in err and "Read-only file system" in err and "\n" not in err


def _read_only() -> None:
    raise OSError(errno.EROFS, "Read-only file system")


def test_a_download_that_stalls_says_how_far_it_came_and_how_to_resume(fake_hub: FakeHub,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")  # (huggingface_hub's read timeout, 10 s by default)
    fake_hub.stall_after = 12 << 20
    proc = _pull("hf.co/org/big-GGUF")
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    line = err.strip().splitlines()[-1]
    assert proc.returncode == 1 and line.startswith("runner: error: the download of big-Q4_K_M.gguf stopped at "), err
    assert line.endswith("of 25.2 MB (ReadTimeout); what came is kept: `runner pull hf.co/org/big-GGUF` resumes it")


def test_rm_takes_what_an_interrupted_split_pull_left_unless_a_pull_is_writing_it(
        fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    assert main(["pull", "hf.co/org/tiny-GGUF:F32"]) == 0
    store = ModelStore()
    repo = store.root / "hf" / "org" / "tiny-GGUF"
    last = repo / MAIN / "tiny-F32-00003-of-00003.gguf"
    partial = repo / ".download" / MAIN / (last.name + ".partial")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(last.read_bytes()[:100])  # the third part stopped midway
    last.unlink()
    assert store.cached() == []  # not a model yet (its first two parts were listed as one)
    with partial.with_name(partial.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a pull is writing it
        assert main(["rm", "hf.co/org/tiny-GGUF:F32"]) == 1
        assert "a pull of hf.co/org/tiny-GGUF:F32 is under way" in capsys.readouterr().err
    assert main(["rm", "hf.co/org/tiny-GGUF:F32"]) == 0  # (it took the partial alone, and listed the rest)
    assert not repo.exists()
