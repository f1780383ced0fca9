"""/metrics for several models: each model process's Prometheus text with a model label on every
sample (HELP and TYPE once per metric), and the router's own gauges."""

from __future__ import annotations

from runner.router.model_pool import ModelState, ModelStatus


def labelled(answers: list[tuple[str, str]], statuses: list[ModelStatus]) -> str:
    comments: dict[str, None] = {}
    samples: list[str] = []
    for model, text in answers:
        label = f'model="{_escaped(model)}"'
        for line in text.splitlines():
            if line.startswith("#"):
                comments.setdefault(line)
                continue
            if not line.strip():
                continue
            name, _, rest = line.partition(" ")
            if "{" in name:
                metric, _, labels = name.partition("{")
                samples.append(f"{metric}{{{label},{labels} {rest}")
            else:
                samples.append(f"{name}{{{label}}} {rest}")
    n_loaded = sum(s.state is ModelState.LOADED for s in statuses)
    own = ["# HELP runner_models_loaded Models loaded (a process each).", "# TYPE runner_models_loaded gauge",
           f"runner_models_loaded {n_loaded}",
           "# HELP runner_models_servable Models a request may name.", "# TYPE runner_models_servable gauge",
           f"runner_models_servable {len(statuses)}"]
    return "\n".join([*own, *_grouped(list(comments), samples)]) + "\n"


def _grouped(comments: list[str], samples: list[str]) -> list[str]:
    """Each metric's HELP and TYPE, then its samples from every model (Prometheus wants them together)."""
    out: list[str] = []
    names = list(dict.fromkeys(c.split(" ")[2] for c in comments if c.count(" ") >= 2))
    for name in names:
        out += [c for c in comments if c.split(" ")[2:3] == [name]]
        out += [s for s in samples if s.partition("{")[0] == name]
    return out


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
