"""Prometheus text for /metrics, read from the engine's counters and slot table."""

from __future__ import annotations

from runner.server.engine_thread import EngineThread


def render_metrics(engine_thread: EngineThread) -> str:
    stats = engine_thread.engine.stats
    slots = engine_thread.slots()
    rows = [
        ("runner_requests_total", "counter", "Requests submitted to the engine.", stats.n_requests),
        ("runner_prompt_tokens_total", "counter", "Prompt tokens computed (prefilled).", stats.n_prompt_tokens),
        ("runner_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's KV cache.",
         stats.n_cached_prompt_tokens),
        ("runner_prompt_tokens_copied_total", "counter", "Reused prompt tokens copied from another slot's KV.",
         engine_thread.engine.scheduler.n_copied_prompt_tokens),
        ("runner_generated_tokens_total", "counter", "Tokens sampled.", stats.n_generated_tokens),
        ("runner_decode_seconds_total", "counter", "Seconds spent in llama_decode.", round(stats.decode_s, 6)),
        ("runner_steps_total", "counter", "Engine steps (one llama_decode each).", stats.n_steps),
        ("runner_padding_tokens_total", "counter", "Junk tokens decoded to keep batches invariant (--batch-invariant).",
         getattr(engine_thread.engine.runtime, "n_padding_tokens", 0)),
        ("runner_forced_tokens_total", "counter", "Tokens a grammar forced, decoded as drafts (jump-forward).",
         stats.n_forced_tokens),
        ("runner_queue_depth", "gauge", "Requests waiting for a slot.", engine_thread.n_waiting),
        ("runner_slots_busy", "gauge", "Slots holding a request.", sum(1 for s in slots if s.state != "idle")),
        ("runner_slots_total", "gauge", "KV slots (--parallel).", len(slots)),
    ]
    speculator = engine_thread.engine.speculator
    if speculator is not None:
        label = f'{{drafter="{speculator.drafter.name}"}}'
        rows += [
            ("runner_draft_tokens_proposed_total", "counter", "Drafted tokens verified by the target.",
             label, speculator.n_proposed),
            ("runner_draft_tokens_accepted_total", "counter", "Drafted tokens the target kept.",
             label, speculator.n_accepted),
        ]
    lines = []
    for name, kind, help_text, *value in rows:
        labels, number = (value[0], value[1]) if len(value) == 2 else ("", value[0])
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{labels} {number}"]
    return "\n".join(lines) + "\n"
