"""The llama_cpp wrapper: where load-time decodes run."""

from __future__ import annotations

import threading

from runner.runtime.llama import Batch, Context, ContextShape, Model, in_scratch_thread


def test_a_thread_that_has_decoded_runs_load_time_decodes_itself(tiny_model: Model) -> None:
    # a second team beside the one such a thread keeps would slow both (and skew calibration)
    seen: dict[str, tuple[int, int]] = {}

    def body() -> None:
        me = threading.get_ident()
        seen["before"] = (me, in_scratch_thread(threading.get_ident))
        ctx = Context(tiny_model, ContextShape(n_seq=1, n_ctx_per_seq=16, n_batch=16, n_threads=2))
        try:
            batch = Batch(16)
            batch.add(0, [1, 2], 0, 1)
            ctx.decode(batch)
        finally:
            ctx.close()
        seen["after"] = (me, in_scratch_thread(threading.get_ident))

    thread = threading.Thread(target=body)  # a fresh thread: nothing decoded on it yet
    thread.start()
    thread.join()
    me, ran_on = seen["before"]
    assert ran_on != me  # no team yet: the work goes to a scratch thread
    me, ran_on = seen["after"]
    assert ran_on == me


def test_extra_weight_buffers_are_off_only_on_a_cpu_with_amx() -> None:
    from runner.runtime.llama import uses_extra_buffers

    sapphire = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"
    zen = "processor\t: 0\nflags\t\t: fpu avx2 avx512f\n"
    assert not uses_extra_buffers(sapphire, env="")
    assert uses_extra_buffers(zen, env="")
    assert uses_extra_buffers(sapphire, env="1") and not uses_extra_buffers(zen, env="0")


def test_the_device_list_starts_with_the_cpu_and_its_memory() -> None:
    from runner.runtime.llama import list_devices

    devices = list_devices()
    assert devices[0].name == "CPU" and devices[0].kind == "cpu" and not devices[0].takes_layers
    assert 0 < devices[0].free_bytes <= devices[0].total_bytes
    assert all(d.takes_layers == (d.kind in ("gpu", "igpu")) for d in devices)


def test_a_ctrl_c_waits_for_load_time_decodes_before_it_is_raised() -> None:
    """The caller frees the model on a KeyboardInterrupt: the scratch thread's work must be over by
    then (the join was cut short: a segfault as `runner run` was stopped while warming up)."""
    import _thread
    import signal

    import pytest

    from runner.runtime import llama

    done = threading.Event()
    team, llama._has_decoded.team = getattr(llama._has_decoded, "team", False), False  # (work on a scratch thread)

    def work() -> str:
        _thread.interrupt_main()  # Ctrl-C, landing while the caller waits for this work
        threading.Event().wait(0.2)
        done.set()
        return "done"

    # (Python's own Ctrl-C handler: a shell running this in the background ignores SIGINT, and then
    # interrupt_main does nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            in_scratch_thread(work)
    finally:
        signal.signal(signal.SIGINT, previous)
        llama._has_decoded.team = team
    assert done.is_set()


def test_a_ctrl_c_caught_in_a_callback_cancels_the_load_and_is_raised(tiny_gguf) -> None:
    """Python raises a Ctrl-C in whatever Python code runs next, which while weights load is
    llama.cpp's log or progress callback, where ctypes printed and dropped it (the chat then started)."""
    import pytest

    from runner.runtime import llama

    llama._interrupted.set()  # (as _log_to_ring does when the KeyboardInterrupt lands in it)
    with pytest.raises(KeyboardInterrupt):
        Model(tiny_gguf)
    assert not llama._interrupted.is_set()
    Model(tiny_gguf).close()  # the next load goes on
