"""llama.cpp's micro-batch split as we model it, and the padding that keeps kernels batch-invariant
(test_model_runner applies it on the tiny model: F32 weights, not batch-invariant on x86)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from runner.runtime.micro_batches import Piece, Row, pad, split

GRAPH_COUNTER = Path(__file__).parents[2] / "bench" / "graph_counter.c"


def shapes(rows: list[Row], n_ubatch: int = 512) -> list[list[tuple[int, int, int]]]:
    return [[(p.row, p.start, p.n) for p in mb] for mb in split(rows, n_ubatch)]


def test_consecutive_slots_share_one_micro_batch_and_gaps_split_it() -> None:
    assert shapes([Row(0, 1), Row(1, 1), Row(2, 1), Row(3, 1)]) == [[(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)]]
    assert len(split([Row(0, 1), Row(2, 1), Row(4, 1), Row(6, 1)], 512)) == 4
    assert len(split([Row(3, 1), Row(2, 1), Row(1, 1), Row(0, 1)], 512)) == 4  # ids must count up in batch order
    assert shapes([Row(2, 1), Row(0, 1), Row(1, 1)]) == [[(0, 0, 1)], [(1, 0, 1), (2, 0, 1)]]


def test_unequal_rows_run_in_lockstep_then_alone() -> None:
    assert shapes([Row(0, 5), Row(1, 1), Row(2, 1), Row(3, 1)]) == [
        [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)], [(0, 1, 4)]]
    # a sequence that ran out ends the run: rows 0 and 2 are no longer neighbours
    assert shapes([Row(0, 2), Row(1, 1), Row(2, 2)]) == [[(0, 0, 1), (1, 0, 1), (2, 0, 1)], [(0, 1, 1)], [(2, 1, 1)]]
    assert shapes([Row(0, 600)]) == [[(0, 0, 512)], [(0, 512, 88)]]
    assert shapes([Row(0, 300), Row(1, 300)]) == [[(0, 0, 256), (1, 0, 256)], [(0, 256, 44), (1, 256, 44)]]
    assert split([Row(0, 3)], 512) == [[Piece(0, 0, 3)]]


def test_padding_widens_lone_tokens_and_lone_logits_rows() -> None:
    one = pad([Row(0, 1, 1)], 512)
    assert one.junk == [1] and one.extra_logits == [[1]]  # decode row + junk, junk's logits too
    mixed = pad([Row(0, 2, 2), Row(1, 1, 1)], 512)  # a verify row's last token would run alone
    assert mixed.junk == [1, 0] and mixed.extra_logits == [[2], []]
    prefill = pad([Row(0, 10, 1)], 512)  # ten tokens, one logits row
    assert prefill.junk == [0] and prefill.extra_logits == [[0]]
    assert pad([Row(0, 1, 1), Row(1, 1, 1)], 512).is_empty
    assert pad([Row(0, 3, 3), Row(1, 3, 1), Row(2, 3, 0)], 512).is_empty
    full = pad([Row(0, 1, 1)], 512, room=[0])  # the context's last position: nowhere to put junk
    assert full.junk == [0] and full.extra_logits == [[]]
    gaps = [Row(0, 1, 1), Row(2, 1, 1), Row(4, 1, 1)]  # three lone tokens
    assert pad(gaps, 512).junk == [1, 1, 1]
    assert pad(gaps, 512, max_junk=2).junk == [1, 1, 0]  # the batch holds two more tokens, no more
    assert pad(gaps, 512, max_junk=0).junk == [0, 0, 0]


COUNT_GRAPHS = r"""
import json, struct, sys
from pathlib import Path
from runner.runtime.llama import Batch, Context, ContextShape, Model

counter, cases = Path(sys.argv[2]), json.loads(sys.argv[3])
context = Context(Model(Path(sys.argv[1])), ContextShape(n_seq=4, n_ctx_per_seq=64, n_batch=128, n_threads=1,
                                                          kv_unified=False))
batch, next_pos, counts = Batch(128), [0] * 4, []
for rows in cases:
    batch.clear()
    for seq, n in rows:  # in the case's order: llama.cpp splits in batch order
        batch.add(seq, [7] * n, next_pos[seq], 1)
        next_pos[seq] += n
    before = struct.unpack("<Q", counter.read_bytes()[:8])[0] if counter.exists() else 0
    context.decode(batch)
    counts.append(struct.unpack("<Q", counter.read_bytes()[:8])[0] - before)
print(json.dumps(counts))
"""


def test_the_split_is_the_graph_runs_llama_cpp_makes(tiny_gguf: Path, tmp_path: Path) -> None:
    """The model above, checked against llama.cpp itself: bench/graph_counter.c (preloaded) counts the
    graphs each llama_decode runs, one per micro-batch."""
    library = tmp_path / "graph_counter.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(GRAPH_COUNTER), "-ldl"], check=True)
    cases = [[(0, 1), (1, 1), (2, 1), (3, 1)], [(0, 1), (2, 1)], [(1, 1), (0, 1)], [(0, 5), (1, 1), (2, 1), (3, 1)],
             [(0, 2), (1, 1), (2, 2)], [(0, 40), (1, 40)], [(0, 3), (1, 7)], [(3, 2), (0, 1), (1, 1), (2, 1)]]
    env = {**os.environ, "LD_PRELOAD": str(library), "GRAPH_COUNTER_FILE": str(tmp_path / "counts")}
    done = subprocess.run([sys.executable, "-c", COUNT_GRAPHS, str(tiny_gguf), env["GRAPH_COUNTER_FILE"], json.dumps(cases)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = [len(split([Row(seq, n) for seq, n in rows], 128)) for rows in cases]
    assert expected == [1, 2, 2, 2, 3, 1, 2, 2]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
