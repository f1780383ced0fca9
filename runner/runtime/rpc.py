"""llama.cpp's RPC backend (ggml-rpc): workers that lend this machine's device to a head on another
one, and the head's side, which registers each worker as a device llama.cpp places layers on.

ggml-rpc aborts the process that holds the model when a worker cannot be reached, speaks another
protocol version or drops mid-use, so the head checks each worker itself first (a TCP connect and
the protocol's HELLO, with a time-out) and turns what it finds into one readable line; what it
cannot check (a worker dying later) is contained by running the model in a process of its own
(router.model_process). Every call here is a C export of the ggml libraries that libllama loads;
llama_cpp binds none of them but llama_supports_rpc."""

from __future__ import annotations

import ctypes
import functools
import socket
import struct
from pathlib import Path

import llama_cpp as _lc

from runner.core.errors import RunnerError
from runner.runtime.devices import Device
from runner.runtime.llama import init_backend, list_devices
from runner.runtime.rpc_address import Endpoint

PROTOCOL = (7, 0)  # ggml-rpc.h's RPC_PROTO_MAJOR/MINOR_VERSION in the llama.cpp runner is built on
PROBE_TIMEOUT_S = 5.0
_HELLO = 14  # RPC_CMD_HELLO: "must be always 14", so every version can be asked which it is
_CAPS = 24  # RPC_CONN_CAPS_SIZE: the transport capabilities after the version (zeros: plain TCP)
BUILD_HINT = ('this llama-cpp-python was built without RPC; rebuild it with it: CMAKE_ARGS="-DGGML_RPC=on" '
              "pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python==" + _lc.__version__)


class RpcError(RunnerError):
    """A worker that cannot be used (another protocol, no device), or a build without RPC."""


class WorkerUnreachable(RpcError):
    """A worker that does not answer (down, busy with another head): it may later."""

    unavailable = True


def supports_rpc() -> bool:
    return bool(_lc.llama_supports_rpc())


def require_rpc() -> None:
    if not supports_rpc():
        raise RpcError(BUILD_HINT)


def hello(endpoint: Endpoint, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, int, int]:
    """Ask the worker its protocol version, as ggml-rpc's own client does first (then hang up: a
    worker serves one head at a time and takes the next connection when this one closes)."""
    try:
        with socket.create_connection((endpoint.resolved().host, endpoint.port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            answer = _receive(sock, 8 + 4 + _CAPS)
    except socket.timeout:
        raise WorkerUnreachable(f"RPC worker {endpoint.text} did not answer within {timeout_s:g} s (a worker serves one "
                       "head at a time: is another runner using it?)") from None
    except OSError as exc:
        raise WorkerUnreachable(f"cannot reach RPC worker {endpoint.text}: {exc.strerror or exc}") from None
    size = struct.unpack_from("<Q", answer)[0]
    major, minor, patch = answer[8], answer[9], answer[10]
    if size != 4 + _CAPS:
        raise RpcError(f"{endpoint.text} did not answer as an RPC worker does (wrong port?)")
    if major != PROTOCOL[0] or minor > PROTOCOL[1]:
        raise RpcError(f"RPC worker {endpoint.text} speaks protocol {major}.{minor}.{patch}, this runner "
                       f"{PROTOCOL[0]}.{PROTOCOL[1]}: run the same runner build on every host")
    return major, minor, patch


def _receive(sock: socket.socket, n_bytes: int) -> bytes:
    data = b""
    while len(data) < n_bytes:
        part = sock.recv(n_bytes - len(data))
        if not part:
            raise OSError(0, "it closed the connection during the handshake (not an RPC worker?)")
        data += part
    return data


@functools.cache
def _api() -> ctypes.CDLL:
    lib = _lc.llama_cpp._lib
    p = ctypes.c_void_p
    for name, restype, argtypes in (
        ("ggml_backend_reg_by_name", p, [ctypes.c_char_p]),
        ("ggml_backend_reg_get_proc_address", p, [p, ctypes.c_char_p]),
        ("ggml_backend_register", None, [p]),
        ("ggml_backend_dev_by_type", p, [ctypes.c_int]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", p, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _rpc_call(name: str, restype: object, argtypes: list[object]) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """One of ggml-rpc's entry points, looked up through its backend registry (as llama.cpp does)."""
    require_rpc()
    init_backend()
    lib = _api()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode())
    if not address:
        raise RpcError(f"this llama.cpp's RPC backend has no {name}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


_added: dict[Endpoint, list[str]] = {}


def add_workers(endpoints: list[Endpoint], timeout_s: float = PROBE_TIMEOUT_S) -> list[Device]:
    """Each worker checked, then registered with llama.cpp as a device (RPC0, RPC1, ... in the given
    order; llama.cpp puts them before any local GPU); the devices layers may go to, as llama.cpp
    will use them."""
    require_rpc()
    for endpoint in endpoints:
        if endpoint not in _added:
            hello(endpoint, timeout_s)
    add_server = _rpc_call("ggml_backend_rpc_add_server", ctypes.c_void_p, [ctypes.c_char_p])
    lib = _api()
    for endpoint in endpoints:
        if endpoint in _added:
            continue
        before = {_device_name(lib, i) for i in range(lib.ggml_backend_dev_count())}
        reg = add_server(_resolved(endpoint).text.encode())
        if not reg:
            raise RpcError(f"RPC worker {endpoint.text} offers no device")
        lib.ggml_backend_register(reg)
        _added[endpoint] = [n for i in range(lib.ggml_backend_dev_count())
                            if (n := _device_name(lib, i)) not in before]
    names = [name for endpoint in endpoints for name in _added[endpoint]]
    return [d for name in names for d in list_devices(rpc=True) if d.name == name]


def _resolved(endpoint: Endpoint) -> Endpoint:
    try:
        return endpoint.resolved()
    except OSError as exc:
        raise WorkerUnreachable(f"cannot resolve RPC worker {endpoint.text}: {exc.strerror or exc}") from None


def _device_name(lib: ctypes.CDLL, index: int) -> str:
    return (lib.ggml_backend_dev_name(lib.ggml_backend_dev_get(index)) or b"").decode()


def serve_worker(endpoint: Endpoint, cache_dir: Path | None, n_threads: int, device_names: list[str]) -> None:
    """Serve these local devices to heads until the process ends (blocking; ggml-rpc prints its own
    banner and a line per head that connects). Returns only when the listening socket fails."""
    start = _rpc_call("ggml_backend_rpc_start_server", None,
                      [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p])
    lib = _api()
    handles = {_device_name(lib, i): lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())}
    missing = [n for n in device_names if n not in handles]
    if missing:
        raise RpcError(f"no device {', '.join(missing)} here; this machine has {', '.join(handles)}")
    chosen = (ctypes.c_void_p * len(device_names))(*(handles[n] for n in device_names))
    cache = str(cache_dir).encode() if cache_dir is not None else None
    start(_resolved(endpoint).text.encode(), cache, n_threads, len(device_names),
          ctypes.cast(chosen, ctypes.c_void_p))
