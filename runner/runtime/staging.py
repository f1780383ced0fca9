"""llama.cpp's staging calls (src/llama-ext.h) that MTP and EAGLE3 drafting need, found by name.

They are exported with C++ linkage, so each is looked up under its plain, Itanium and MSVC names,
lazily and once. The header allows breaking changes: a library that lacks one makes `require`
raise ModelLoadError with one line, and nothing else in runner depends on them. Only this module
and runtime/llama.py touch them.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import llama_cpp as _lc

from runner.core.errors import ModelLoadError

_ctx, _model = ctypes.c_void_p, ctypes.c_void_p
_floats = ctypes.POINTER(ctypes.c_float)

# name -> (other exported names, argument types, result type)
_CALLS: dict[str, tuple[tuple[str, ...], list[Any], Any]] = {
    "llama_set_embeddings_nextn": (("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                                    "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z"),
                                   [_ctx, ctypes.c_bool, ctypes.c_bool], None),
    "llama_get_embeddings_nextn": (("_Z26llama_get_embeddings_nextnP13llama_context",
                                    "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z"), [_ctx], _floats),
    "llama_set_embeddings_layer_inp": (("_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
                                        "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"),
                                       [_ctx, ctypes.c_uint32, ctypes.c_bool], None),
    "llama_get_embeddings_layer_inp": (("_Z30llama_get_embeddings_layer_inpP13llama_contextj",
                                        "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"),
                                       [_ctx, ctypes.c_uint32], _floats),
    "llama_model_target_layer_ids": (("_Z28llama_model_target_layer_idsPK11llama_model",
                                      "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z"),
                                     [_model], ctypes.POINTER(ctypes.c_int32)),
    "llama_model_target_layer_ids_n": (("_Z30llama_model_target_layer_ids_nPK11llama_model",
                                        "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z"),
                                       [_model], ctypes.c_uint32),
}
MTP_CALLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn")
EAGLE3_CALLS = MTP_CALLS + ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp",
                            "llama_model_target_layer_ids", "llama_model_target_layer_ids_n")


def _library() -> Any:
    return _lc.llama_cpp._lib


@functools.cache
def _find(name: str) -> Callable[..., Any] | None:
    others, argtypes, restype = _CALLS[name]
    lib = _library()
    for symbol in (name, *others):
        fn = getattr(lib, symbol, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, restype
            return fn
    return None


def missing(names: tuple[str, ...]) -> list[str]:
    """The calls among `names` this llama.cpp does not export."""
    return [name for name in names if _find(name) is None]


def require(names: tuple[str, ...], what: str) -> None:
    """ModelLoadError naming what this llama.cpp lacks for `what` (e.g. '--spec mtp')."""
    absent = missing(names)
    if absent:
        raise ModelLoadError(f"{what} needs llama.cpp's staging calls {', '.join(absent)}, which this build "
                             f"(llama-cpp-python {_lc.__version__}) does not export")


def call(name: str, *args: Any) -> Any:
    fn = _find(name)
    if fn is None:  # (require() is asked first, at load)
        raise ModelLoadError(f"llama.cpp does not export {name}")
    return fn(*args)
