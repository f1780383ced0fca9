"""Helpers shared by the benchmark scripts: chat prompts, model paths and a ratio table."""

from __future__ import annotations

import statistics
from pathlib import Path

from runner.catalog.pull import pull
from runner.catalog.store import ModelStore

# Short open questions for chat load; no two alike.
CHAT_PROMPTS = [
    "Explain how a bicycle works.", "Write a short poem about autumn.", "What causes rain?",
    "Describe the city of Paris.", "How do plants grow?", "Tell me about the history of tea.",
    "Why do cats purr?", "What is a computer?", "Describe a sunrise over the sea.", "How does a car engine work?",
    "What is the moon made of?", "Give advice for learning to cook.", "Describe a forest in winter.",
    "What do bees do all day?", "How are mountains formed?", "Write a letter to a friend.",
    "Why is the sky blue?", "How do birds navigate?", "Describe a busy market.", "What is a volcano?",
    "Explain how a refrigerator keeps food cold.", "Tell me a story about a lighthouse keeper.",
    "What makes a good friend?", "How is paper made?",
]


def model_path(name: str) -> Path:
    """A catalog name (pulled when missing), or a path to a .gguf."""
    if name.endswith(".gguf") and Path(name).exists():
        return Path(name)
    store = ModelStore()
    return pull(store.catalog.resolve(name), store)


def median(values: list[float]) -> float:
    return statistics.median(values)


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    cells = [[str(h) for h in headers]] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print(line(row))
