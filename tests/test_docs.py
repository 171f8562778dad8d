"""Every example in README.md and docs/*.md runs, as a reader would run it.

What runs:
- fenced ```python blocks: all python blocks of one markdown file run in order, in one fresh interpreter
  and one namespace, so a block may use what an earlier block of the same file defined (the docs read
  top to bottom). Each block is compiled under the markdown file's name at its own line numbers, so a
  traceback points at the line in the document.
- fenced ```bash and ```sh blocks: each block runs alone under ``bash`` with ``set -euo pipefail``; a
  failing command reports its line in the document. Processes a block leaves behind (a server it started
  in the background and did not stop because it failed) are ended with the block's process group.

What does not run, and how a reader sees that:
- ```console blocks: listings (output, or commands shown with their output);
- blocks in any other language (```text for diagrams, ```yaml for file contents...), and fences without
  a language;
- a block preceded by ``<!-- not-tested: REASON -->`` (on the line before its fence; blank lines between
  are allowed). The reason is required: long-running commands (``make run`` serves until stopped),
  installs (``pip install``), benchmarks that take minutes or need data outside the checkout.

Where it runs: a fresh temporary directory per python file and per shell block, holding links to the
checkout's ``bench``, ``examples``, ``tests`` and ``src`` (so commands written for the checkout's root work
and what they write lands in the temporary directory), with the interpreter's ``bin`` directory (the
project's venv) first on PATH, this checkout's ``src`` first on PYTHONPATH and no ``CLAWVM_*`` variable
inherited from the caller's environment.

A failure names the file, the block's first line and the block's output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGUAGES = {"python": "python", "bash": "shell", "sh": "shell"}
LINKED = ("bench", "examples", "tests", "src")
BLOCK_TIMEOUT_S = 60
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+)\s*(?P<lang>[\w+-]*)")
_NOT_TESTED = re.compile(r"^<!--\s*not-tested:(?P<reason>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    file: Path
    line: int  # the line of the opening fence (1-based)
    lang: str  # as written after the fence ("" when none)
    source: str
    not_tested: str | None  # the reason given in a preceding <!-- not-tested: ... --> comment

    @property
    def where(self) -> str:
        return f"{_shown(self.file)}:{self.line}"

    @property
    def kind(self) -> str | None:
        """``python`` or ``shell`` when the block runs, else None."""
        return None if self.not_tested is not None else RUN_LANGUAGES.get(self.lang)


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, with their line, language and not-tested reason."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{_shown(path)}:{i + 1}: fence never closed")
        blocks.append(Block(path, i + 1, opening["lang"].lower(), "\n".join(body) + "\n", _reason(lines, i)))
        i = j + 1
    return blocks


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _reason(lines: list[str], fence_index: int) -> str | None:
    """The reason of a not-tested comment on the nearest non-blank line above the fence, if any."""
    k = fence_index - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    found = _NOT_TESTED.match(lines[k].strip()) if k >= 0 else None
    return found["reason"].strip() if found else None


BLOCKS = [b for doc in DOCS for b in parse_blocks(doc)]
PYTHON_FILES = sorted({b.file for b in BLOCKS if b.kind == "python"}, key=DOCS.index)
SHELL_BLOCKS = [b for b in BLOCKS if b.kind == "shell"]


# ---- the sandbox every example runs in -------------------------------------------------------------------
def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWVM_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH", "")] if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _sandbox(work: Path) -> None:
    for name in LINKED:
        (work / name).symlink_to(ROOT / name, target_is_directory=True)


def _run(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``argv`` in its own process group; output (stdout and stderr) goes to a file, not a pipe, so a
    background child that outlives the command cannot hold the test up. Whatever is left in the group
    when the command ends is ended with it."""
    log = cwd.parent / f"{cwd.name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=_environment(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            _end_group(proc.pid)
    text = log.read_text(encoding="utf-8", errors="replace")
    if code == -1:
        text += f"\n[timed out after {BLOCK_TIMEOUT_S} s]"
    return code, text


def _end_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(0.2)


# ---- python: one interpreter per markdown file -----------------------------------------------------------
_RUNNER = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for block in json.load(open(sys.argv[1], encoding="utf-8")):
    print(f"\\n@@block {block['line']}", flush=True)
    # padded so that the block's first line is the line after its fence, as in the document
    code = compile("\\n" * block["line"] + block["source"], block["file"], "exec")
    try:
        exec(code, namespace)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
"""


@pytest.mark.parametrize("doc", PYTHON_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_examples_run(doc: Path) -> None:
    blocks = [b for b in BLOCKS if b.file == doc and b.kind == "python"]
    name = _shown(doc)
    with tempfile.TemporaryDirectory(prefix="clawvm-docs-") as tmp:
        code, output = _run_python(blocks, name, Path(tmp))
    if code != 0:
        line, block_output = _last_block(output)
        pytest.fail(f"{name}:{line}: python block failed (exit {code}); its output:\n{block_output}")


def _run_python(blocks: list[Block], name: str, tmp: Path) -> tuple[int, str]:
    work = tmp / "work"
    work.mkdir()
    _sandbox(work)
    spec = tmp / "blocks.json"
    spec.write_text(json.dumps([{"line": b.line, "source": b.source, "file": name} for b in blocks]))
    runner = tmp / "runner.py"
    runner.write_text(_RUNNER)
    return _run([sys.executable, str(runner), str(spec)], work)


def _last_block(output: str) -> tuple[str, str]:
    """The line of the block that was running when the interpreter stopped, and that block's output."""
    marks = list(re.finditer(r"^@@block (\d+)$", output, re.M))
    if not marks:
        return "?", output
    return marks[-1][1], output[marks[-1].end() :].strip()


# ---- shell: each block alone -----------------------------------------------------------------------------
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_examples_run(block: Block) -> None:
    with tempfile.TemporaryDirectory(prefix="clawvm-docs-") as tmp:
        code, output = _run_shell(block, Path(tmp))
    if code != 0:
        pytest.fail(f"{block.where}: {block.lang} block failed (exit {code}); its output:\n{output.strip()}")


_SHELL_PROLOGUE = "set -euo pipefail; trap 'echo \"[failed at line $LINENO: $BASH_COMMAND]\" >&2' ERR"


def _run_shell(block: Block, tmp: Path) -> tuple[int, str]:
    work = tmp / "work"
    work.mkdir()
    _sandbox(work)
    script = tmp / "block.sh"
    # line 1 sets the shell up; padding puts the block's lines at their line numbers in the document
    script.write_text(_SHELL_PROLOGUE + "\n" * block.line + block.source)
    return _run(["bash", str(script)], work)


# ---- the conventions themselves --------------------------------------------------------------------------
def test_docs_have_examples_that_run() -> None:
    """The parser finds the runnable blocks (a broken fence regex would otherwise test nothing)."""
    assert (ROOT / "README.md") in PYTHON_FILES
    assert len(PYTHON_FILES) >= 5 and len(SHELL_BLOCKS) >= 5


def test_readme_starts_with_the_two_setup_commands() -> None:
    """A reader's first two commands: the demo, then what CI runs."""
    first = parse_blocks(ROOT / "README.md")[0]
    commands = [line.split("#")[0].strip() for line in first.source.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]


def test_every_skipped_block_says_why() -> None:
    for block in BLOCKS:
        if block.not_tested is not None:
            assert block.not_tested, f"{block.where}: say why after 'not-tested:'"
            assert block.lang in RUN_LANGUAGES, f"{block.where}: only runnable languages need not-tested"


def test_a_failing_example_names_its_file_line_and_output(tmp_path: Path) -> None:
    """The harness itself: a block that fails is reported at its line in the document, with its output."""
    doc = tmp_path / "sample.md"
    doc.write_text(
        "# t\n\n```python\nprint('fine')\n```\n\n```python\nprint('about to fail')\n1 / 0\n```\n\n"
        "<!-- not-tested: shown only -->\n```sh\nexit 3\n```\n\n"
        "```bash\necho before\nfalse\necho after\n```\n"
    )
    blocks = parse_blocks(doc)
    assert [(b.line, b.lang, b.kind) for b in blocks] == [
        (3, "python", "python"),
        (7, "python", "python"),
        (13, "sh", None),
        (17, "bash", "shell"),
    ]
    assert blocks[2].not_tested == "shown only"
    (tmp_path / "py").mkdir()
    code, output = _run_python(blocks[:2], "sample.md", tmp_path / "py")
    line, block_output = _last_block(output)
    assert (code, line) == (1, "7")
    assert "about to fail" in block_output and "fine" not in block_output
    assert 'File "sample.md", line 9' in block_output and "ZeroDivisionError" in block_output
    (tmp_path / "sh").mkdir()
    code, output = _run_shell(blocks[3], tmp_path / "sh")
    assert code == 1
    assert "before" in output and "after" not in output and "[failed at line 19: false]" in output
