"""A script that ends without ``close()`` exits cleanly, and what it recorded is embedded on the next open.

Before the embedding worker was stopped at exit, about one run in five aborted after the script's last line
("terminate called without an active exception", exit 134): the worker, a daemon thread, was inside ONNX
Runtime when the interpreter finalized. Each engine runs the script 20 times, a few processes at a time
(the load makes the timing vary, which is what the race needs).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from clawvm import Harness, MiniLMEmbedder
from engines import harness_target

RUNS = 20
SCRIPT = """
import sys
from clawvm import Harness
h = Harness.open(sys.argv[1])
m = h.record("hello from a script that never calls close, run " + sys.argv[2])
print(m.id)
"""


def _run_script(target: str, run: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, target, str(run)], capture_output=True, text=True, timeout=120
    )


def test_a_script_without_close_exits_cleanly(
    engine_name: str, tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    targets = [harness_target(engine_name, tmp_path, f"run{i}.db") for i in range(RUNS)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(_run_script, targets, range(RUNS)))
    for result in results:
        assert (result.returncode, result.stderr) == (0, ""), result.stderr[-2000:]
    if engine_name == "memory":
        return  # nothing outlives the process
    for target, result in zip(targets, results, strict=True):
        memory_id = result.stdout.strip()
        with Harness.open(target, embedder=embedder) as h:
            h.flush()
            assert h.get(memory_id).content.startswith("hello from a script")
            vectors = h.store.vectors_of([memory_id])
            assert set(vectors) == {memory_id}
            expected = embedder.embed_query(h.get(memory_id).content)
            assert float(np.dot(vectors[memory_id], expected)) > 0.999
