"""Prometheus text for /metrics, from a snapshot of the engine's counters and slot table."""

from __future__ import annotations

from runner.scheduler.snapshot import EngineSnapshot


def render_metrics(snap: EngineSnapshot) -> str:
    rows = [
        ("runner_requests_total", "counter", "Requests submitted to the engine.", snap.n_requests),
        ("runner_prompt_tokens_total", "counter", "Prompt tokens computed (prefilled).", snap.n_prompt_tokens),
        ("runner_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's KV cache.",
         snap.n_cached_prompt_tokens),
        ("runner_prompt_tokens_copied_total", "counter", "Reused prompt tokens copied from another slot's KV.",
         snap.n_copied_prompt_tokens),
        ("runner_generated_tokens_total", "counter", "Tokens sampled.", snap.n_generated_tokens),
        ("runner_decode_seconds_total", "counter", "Seconds spent in llama_decode.", round(snap.decode_s, 6)),
        ("runner_steps_total", "counter", "Engine steps (one llama_decode each).", snap.n_steps),
        ("runner_padding_tokens_total", "counter", "Junk tokens decoded to keep batches invariant (--batch-invariant).",
         snap.n_padding_tokens),
        ("runner_forced_tokens_total", "counter", "Tokens a grammar forced, decoded as drafts (jump-forward).",
         snap.n_forced_tokens),
        ("runner_generations_finished_total", "counter",
         "Generations ended (each choice, beam and prompt of a request), by reason.",
         [(f'{{reason="{reason}"}}', n) for reason, n in snap.n_finished]),
        ("runner_queue_depth", "gauge", "Requests waiting for a slot.", snap.n_waiting),
        ("runner_slots_busy", "gauge", "Slots holding a request.", snap.n_busy_slots),
        ("runner_slots_total", "gauge", "KV slots (--parallel).", len(snap.slots)),
    ]
    if snap.drafts is not None:
        label = f'{{drafter="{snap.drafts.drafter}"}}'
        rows += [
            ("runner_draft_tokens_proposed_total", "counter", "Drafted tokens verified by the target.",
             label, snap.drafts.n_proposed),
            ("runner_draft_tokens_accepted_total", "counter", "Drafted tokens the target kept.",
             label, snap.drafts.n_accepted),
        ]
        by_kind = snap.drafts.by_kind
        if by_kind:
            kind_label = lambda k: f'{{drafter="{snap.drafts.drafter}",kind="{k}"}}'  # noqa: E731
            rows += [
                ("runner_draft_tokens_proposed_by_kind_total", "counter",
                 "Drafted tokens verified, by the kind of proposal (acceptance is learned per kind).",
                 [(kind_label(k), proposed) for k, proposed, _ in by_kind]),
                ("runner_draft_tokens_accepted_by_kind_total", "counter", "Drafted tokens kept, by kind.",
                 [(kind_label(k), accepted) for k, _, accepted in by_kind]),
            ]
        rows += [(f"runner_{name}", "gauge", _GAUGE_HELP.get(name, name), label, value)
                 for name, value in snap.drafts.gauges]
    lines = []
    for name, kind, help_text, *value in rows:
        samples = value[0] if len(value) == 1 and isinstance(value[0], list) else (
            [(value[0], value[1])] if len(value) == 2 else [("", value[0])])
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{labels} {number}" for labels, number in samples]
    return "\n".join(lines) + "\n"


_GAUGE_HELP = {
    "ngram_store_bytes": "Memory of the n-gram store learned across requests (allocated once).",
    "ngram_store_entries": "N-grams the store holds.",
    "mtp_target_rows_bytes": "Memory of the target's hidden rows kept for MTP drafting (per slot, grows with its context).",
    "eagle3_target_rows_bytes": "Memory of the target's layer inputs kept for the EAGLE3 head (per slot, grows with its context).",
}
