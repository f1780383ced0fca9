"""llama.cpp's RPC backend on loopback: a tiny model placed on `runner rpc-worker` processes computes
what it computes locally, and every way a worker can be wrong is one line, never an abort."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rpc_workers import Worker, free_port

from runner.cli.main import main
from runner.core.errors import OptionError
from runner.runtime import rpc
from runner.runtime.rpc_address import Endpoint
from runner.runtime.gpu_fit import LayerCosts
from runner.runtime.layer_split import device_shares, parse_tensor_split, place_units
from runner.runtime.devices import Device

# the head, in a process of its own: a worker registered here would stay registered for the whole suite
HEAD = """
import json, sys
import numpy as np
from runner.runtime import rpc
from runner.runtime.rpc_address import Endpoint
from runner.runtime.llama import Batch, Context, ContextShape, Model
path, workers = sys.argv[1], sys.argv[2]
from runner.runtime.rpc_address import parse_workers
names = [d.name for d in rpc.add_workers(parse_workers(workers))] if workers else None
model = Model(path, -1 if names else 0, devices=names)
ctx = Context(model, ContextShape(n_seq=1, n_ctx_per_seq=64, n_batch=64, n_threads=1))
ids = model.tokenize("the quick brown fox")
batch = Batch(64)
batch.add(0, ids, 0, 1)
first = ctx.decode(batch)[0]
tokens, row = [], first
for pos in range(len(ids), len(ids) + 12):
    tokens.append(int(np.argmax(row)))
    batch.clear()
    batch.add(0, [tokens[-1]], pos, 1)
    row = ctx.decode(batch)[0]
print(json.dumps({"tokens": tokens, "logits": [float(x) for x in first], "devices": names}))
"""


def run_head(model: Path, workers: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", HEAD, str(model), workers], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Worker]]:
    started = [Worker(), Worker()]
    yield started
    for worker in started:
        worker.kill()


def test_a_tiny_model_on_one_worker_and_across_two_computes_what_it_computes_here(tiny_gguf: Path,
                                                                                  workers: list[Worker]) -> None:
    local = run_head(tiny_gguf)
    one = run_head(tiny_gguf, workers[0].address)
    two = run_head(tiny_gguf, f"{workers[0].address},{workers[1].address}")
    assert local["devices"] is None and one["devices"] == ["RPC0"] and two["devices"] == ["RPC0", "RPC1"]
    for remote in (one, two):
        assert remote["tokens"] == local["tokens"]
        assert max(abs(a - b) for a, b in zip(remote["logits"], local["logits"])) < 1e-4


def cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "RUNNER_LLAMA_LOG": ""})


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("runner: error: "), done.stderr
    return lines[0].removeprefix("runner: error: ")


def test_a_worker_that_is_not_there_or_a_malformed_address_is_one_line(tiny_gguf: Path) -> None:
    port = free_port()  # nobody listens there
    assert one_error_line(cli("run", str(tiny_gguf), "-p", "hi", "--rpc", f"127.0.0.1:{port}")) == (
        f"cannot reach RPC worker 127.0.0.1:{port}: Connection refused")
    assert one_error_line(cli("run", str(tiny_gguf), "-p", "hi", "--rpc", "127.0.0.1")) == (
        "not an RPC worker address: '127.0.0.1' (expected HOST:PORT, e.g. 192.168.1.20:50052)")
    assert one_error_line(cli("run", str(tiny_gguf), "-p", "hi", "--rpc", "[::1]:50052")) == (
        "'[::1]:50052': llama.cpp's RPC speaks IPv4 only; give an IPv4 address or a host name")
    assert "names a worker twice" in one_error_line(
        cli("run", str(tiny_gguf), "-p", "hi", "--rpc", f"127.0.0.1:{port},127.0.0.1:{port}"))


class FakeWorker:
    """A listener that answers HELLO with another protocol version, as an HTTP server would, or never."""

    def __init__(self, version: tuple[int, int, int] | None, reply: bytes = b"") -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.version, self.reply = version, reply
        self.asked = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.sock:
            conn, _ = self.sock.accept()
        with conn:
            request = conn.recv(1 + 8 + 24, socket.MSG_WAITALL)
            self.asked.set()
            assert request[0] == 14 and struct.unpack_from("<Q", request, 1)[0] == 24
            conn.sendall(self.reply if self.version is None else
                         struct.pack("<Q", 28) + bytes([*self.version, 0]) + bytes(24))
            with contextlib.suppress(OSError):  # (a head that hangs up on unread bytes resets the connection)
                conn.recv(1)  # until the head hangs up


def test_a_worker_of_another_protocol_version_is_one_line_before_llama_cpp_sees_it() -> None:
    fake = FakeWorker((6, 1, 0))
    with pytest.raises(rpc.RpcError) as refused:
        rpc.hello(Endpoint("127.0.0.1", fake.port))
    assert str(refused.value) == (f"RPC worker 127.0.0.1:{fake.port} speaks protocol 6.1.0, this runner 7.0: "
                                  "run the same runner build on every host")
    assert not refused.value.unavailable  # (a router answers 500: retrying will not help)


def test_a_port_where_something_else_listens_is_one_line() -> None:
    fake = FakeWorker(None, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    with pytest.raises(rpc.RpcError) as wrong:
        rpc.hello(Endpoint("127.0.0.1", fake.port))
    assert str(wrong.value) == f"127.0.0.1:{fake.port} did not answer as an RPC worker does (wrong port?)"


def test_serve_with_a_malformed_rpc_address_is_one_line_before_it_listens(tiny_gguf: Path) -> None:
    assert one_error_line(cli("serve", str(tiny_gguf), "--port", "0", "--rpc", "127.0.0.1:0")) == (
        "not an RPC worker address: '127.0.0.1:0' (expected HOST:PORT, e.g. 192.168.1.20:50052)")


def test_a_worker_that_never_answers_is_one_line_after_the_time_out() -> None:
    fake = FakeWorker(None)
    with pytest.raises(rpc.WorkerUnreachable) as silent:
        rpc.hello(Endpoint("127.0.0.1", fake.port), timeout_s=0.5)
    assert fake.asked.is_set() and "did not answer within 0.5 s" in str(silent.value)


def test_a_build_without_rpc_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tiny_gguf: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rpc, "supports_rpc", lambda: False)
    assert main(["rpc-worker", "--port", str(free_port())]) == 1
    assert main(["run", str(tiny_gguf), "-p", "hi", "--rpc", "127.0.0.1:50052"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"runner: error: {rpc.BUILD_HINT}"] * 2 and 'CMAKE_ARGS="-DGGML_RPC=on"' in rpc.BUILD_HINT


def test_a_worker_binds_loopback_unless_told_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc-worker", "--host", "0.0.0.0", "--port", str(free_port())]) == 1
    assert "add --allow-network" in capsys.readouterr().err
    assert main(["rpc-worker", "--device", "gpu7", "--port", str(free_port())]) == 1
    assert "--device gpu7: this machine has CPU" in capsys.readouterr().err


def test_tensor_split_is_this_machine_then_each_worker() -> None:
    split = parse_tensor_split("1,1,2", 2)
    assert split is not None and split.n_gpu_layers(30) == 23  # 31 units, a quarter stays here
    assert parse_tensor_split("", 2) is None
    for bad in ("1,1", "1,a,1", "1,-1,1", "1,0,0"):
        with pytest.raises(OptionError, match="give 3 shares"):
            parse_tensor_split(bad, 2)


def test_layers_are_placed_as_llama_cpp_places_them() -> None:
    # SmolLM2 (30 layers) with --tensor-split 1,1,2 over two workers: llama.cpp's load log said
    # RPC0 16.91 MiB and RPC1 58.28 MiB (layers 8-15, then 16-29 and the output head)
    assert place_units(30, 23, [1.0, 2.0]) == [-1] * 8 + [0] * 8 + [1] * 15
    assert place_units(30, -1, [1.0, 1.0]) == [0] * 16 + [1] * 15
    assert place_units(30, 0, [1.0]) == [-1] * 31
    costs = LayerCosts((10,) * 4, 7, (100,) * 4, 0)
    gpu = Device("RPC0", "127.0.0.1:50052", "gpu", 1 << 30, 1 << 30)
    here, there = device_shares(costs, 3, [gpu], None, embeddings_bytes=5)
    assert (here.layers, here.has_output, here.weights_bytes, here.kv_bytes) == ((0, 1), False, 25, 200)
    assert (there.layers, there.has_output, there.weights_bytes, there.kv_bytes) == ((2, 3), True, 27, 200)
    assert there.describe() == "RPC0 (127.0.0.1:50052): layers 2-3 and the output head, 0.0 MiB weights, 0.0 MiB KV"
