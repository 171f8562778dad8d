"""The CLI is a thin shell: every command has help, and the commands work end to end on a SQLite file."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawvm import Harness
from clawvm.cli import main
from clawvm.cli.common import hoist_group_options
from clawvm.core.errors import ValidationError
from clawvm.core.model import Kind
from clawvm.store import SQLiteStore, store_from_url
from clawvm.store.crypto import KEY_ENV, KEY_FILE_ENV, DataKey
from clawvm.store.eventlog import MAX_AGE_DAYS, Retention
from clawvm.store.keys import Keyring
from clawvm.store.migrate import migrate
from engines import engine_of
from loopback import ServeProcess

COMMANDS = sorted(main.commands)


def run(db: Path, *args: str, ok: bool = True, stdin: str | None = None) -> str:
    result = CliRunner().invoke(
        main, ["--db", str(db), "--no-embed", *args], input=stdin, catch_exceptions=False
    )
    if ok:
        assert result.exit_code == 0, result.output
    return result.output


def test_expected_commands_exist() -> None:
    assert {"add", "search", "show", "forget", "export", "import", "stats", "demo"} <= set(COMMANDS)
    # what the SDK, REST and MCP do to one memory, a session's checkpoints, and listing without a query
    assert {"edit", "pin", "unpin", "list", "checkpoint", "checkpoints", "rollback"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.output
    cmd = main.commands[command]
    assert cmd.help, f"{command} has no help text"
    for param in cmd.params:
        if isinstance(param, click.Option):
            assert param.help, f"{command} {param.opts} has no help"


def test_add_search_show_forget(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    mid = run(
        db,
        "add",
        "The deploy failed because the disk on build-07 was full",
        "--kind",
        "error",
        "--session",
        "s1",
        "--tag",
        "ci",
    ).strip()
    run(db, "add", "Lunch order: two pizzas", "--session", "s2")
    out = run(db, "search", "why did the deploy fail", "--json")
    first = json.loads(out.splitlines()[0])
    assert first["id"] == mid and "lexical" in first["explain"]
    assert mid in run(db, "search", "disk full", "--session", "s1", "--tag", "ci")
    assert run(db, "search", "disk full", "--session", "s2").strip() == ""
    shown = json.loads(run(db, "show", mid))
    assert shown["kind"] == "error" and shown["tags"] == ["ci"]
    # a person's searches leave the store as it was; --track counts one as an agent's recall
    assert (shown["version"], shown["access_count"]) == (1, 0)
    run(db, "search", "disk full", "--track")
    assert json.loads(run(db, "show", mid))["access_count"] == 1
    with Harness.open(db, embedder=None) as h:
        h.update(mid, tags=["ci", "disk"])  # another writer changed it since version 1
    stale = CliRunner().invoke(main, ["--db", str(db), "forget", mid, "--expected-version", "1"])
    assert stale.exit_code == 2 and "version" in stale.output
    assert json.loads(run(db, "show", mid))["id"] == mid
    run(db, "forget", mid)
    result = CliRunner().invoke(main, ["--db", str(db), "show", mid])
    assert result.exit_code == 2 and "not found" in result.output


def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    run(db, "add", "keep me")
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "add", "x", "--kind", "bogus"])
    assert result.exit_code == 2
    assert "kind" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "add", "{oops", "--json-content"])
    assert result.exit_code == 2 and "content" in result.output
    for scalar in ('"just a string"', "42", "null"):  # stored as text, or refused with a fix for Python
        result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "add", scalar, "--json-content"])
        assert result.exit_code == 2 and "drop --json-content" in result.output, result.output
    assert json.loads(run(db, "stats"))["memories"] == 1


def test_clawvm_s_own_options_work_after_the_command_too(tmp_path: Path) -> None:
    """``clawvm search "q" --no-embed`` said "No such option" although ``--no-embed`` is clawvm's: its own
    options are taken before or after the command (a value with its option, ``=`` or not)."""
    db = tmp_path / "after.db"

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    mid = invoke("add", "the deploy failed on build-07", "--no-embed", "--db", str(db)).strip()
    assert mid in invoke("search", "deploy", f"--db={db}", "--no-embed", "-k", "3")
    stats = json.loads(invoke("stats", "--no-embed", "--db", str(db)))
    assert stats["memories"] == 1 and stats["unembedded"] == 1  # --no-embed was heard: nothing embedded
    # after "--" everything is the command's own text, even a word that looks like clawvm's option
    literal = invoke("--db", str(db), "--no-embed", "add", "--", "--no-embed").strip()
    assert json.loads(invoke("--db", str(db), "--no-embed", "show", literal))["content"] == "--no-embed"


@pytest.mark.parametrize(
    "command",
    [
        ["search", "deploy"],
        ["show", "x"],
        ["forget", "x"],
        ["stats"],
        ["export"],
        ["prune-events"],
        ["keys", "list"],
        ["keys", "revoke", "x"],
        ["review", "list"],
        ["replay", "s1"],
        ["list"],
        ["edit", "x", "--kind", "note"],
        ["pin", "x"],
        ["unpin", "x"],
        ["checkpoint", "s1", "before"],
        ["checkpoints", "s1"],
        ["rollback", "x"],
    ],
)
def test_a_command_that_reads_refuses_a_store_that_is_not_there(tmp_path: Path, command: list[str]) -> None:
    """A mistyped --db made an empty store (and its directory) and answered from it, as if it were empty."""
    db = tmp_path / "no" / "such.db"
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *command])
    assert result.exit_code == 2 and f"no ClawVM store at {db}" in result.output
    assert not db.parent.exists()


@pytest.mark.parametrize("made", ["touched", "sqlite without tables"])
@pytest.mark.parametrize("command", [["stats"], ["export"], ["search", "x"], ["keys", "list"]])
def test_a_command_that_reads_leaves_an_empty_file_as_it_is(
    tmp_path: Path, made: str, command: list[str]
) -> None:
    """An empty file (or an empty SQLite database) was made into a store by a command that only reads."""
    db = tmp_path / "empty.db"
    db.touch()
    if made != "touched":
        sqlite3.connect(db).close()
    before = db.read_bytes()
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *command])
    assert result.exit_code == 2 and "no ClawVM store" in result.output
    assert db.read_bytes() == before


def test_a_command_that_fails_on_a_new_file_leaves_no_file(tmp_path: Path) -> None:
    """`clawvm --db agnet.db add ""` left an empty store at the misspelt path, which the next command took
    for the store; a failure after a write, or on a file that was there, leaves the file."""
    typo = tmp_path / "agnet.db"
    for command in (["add", ""], ["add", "x", "--kind", "nonsense"], ["keys", "create", "--role", "wizard"]):
        result = CliRunner().invoke(main, ["--db", str(typo), "--no-embed", *command])
        assert result.exit_code == 2, result.output
        assert list(tmp_path.iterdir()) == [], command
    db = tmp_path / "agent.db"
    run(db, "add", "a note")
    assert CliRunner().invoke(main, ["--db", str(db), "--no-embed", "add", ""]).exit_code == 2
    assert "a note" in run(db, "search", "note")


def test_file_errors_are_one_line(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    run(db, "add", "a note")
    out = tmp_path / "missing" / "dump.jsonl"
    result = CliRunner().invoke(main, ["--db", str(db), "export", "-o", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == f"error: {out}: No such file or directory"
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database, but long enough to have a header's worth of bytes " * 3)
    for wrong in (tmp_path, not_sqlite):  # a directory, a text file: the message names it and what to do
        result = CliRunner().invoke(main, ["--db", str(wrong), "--no-embed", "stats"])
        assert result.exit_code == 2 and f"sqlite open of {wrong} failed" in result.output
        assert "point it at a ClawVM store" in result.output
    assert not_sqlite.read_text().startswith("not a database")
    result = CliRunner().invoke(main, ["search", "deploy", "--db"])  # moved bare, it took "search"
    assert result.exit_code == 2 and "Option '--db' requires an argument" in result.output
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "search", "note", "--preset", "dense"])
    assert result.exit_code == 2 and "--preset dense searches by embedding only" in result.output
    result = CliRunner().invoke(main, ["search", "deploy", "--db"])
    assert result.exit_code == 2 and "Option '--db' requires an argument" in result.output


@pytest.mark.parametrize("command", [["serve"], ["serve", "--workers", "2"], ["mcp", "--http"]])
def test_a_port_in_use_is_refused_in_one_line_naming_another(tmp_path: Path, command: list[str]) -> None:
    """serve printed a traceback (--workers 2) or uvicorn's bare log line on a taken port."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        args = ["--db", str(tmp_path / "p.db"), "--no-embed", *command, "--port", str(port)]
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"port: {port} on 127.0.0.1 is taken by another process" in result.output
    assert f"--port {port + 1}" in result.output


def test_a_host_that_cannot_be_listened_on_is_named_not_the_port(tmp_path: Path) -> None:
    """An unknown host was reported as the port's fault, with another port to try."""
    args = ["--db", str(tmp_path / "h.db"), "--no-embed", "serve", "--host", "no-such-host.invalid"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "host: no-such-host.invalid cannot be listened on" in result.output
    assert "--port" not in result.output


def test_a_misspelt_option_of_clawvm_s_own_after_the_command_gets_a_suggestion() -> None:
    result = CliRunner().invoke(main, ["search", "q", "--no-embedd"])
    assert result.exit_code == 2 and "Did you mean '--no-embed'?" in result.output


def test_hoisting_moves_only_the_group_s_options_and_their_values() -> None:
    hoisted = hoist_group_options(
        main, ["search", "q", "--db", "a.db", "-k", "3", "--no-embed", "--json", "--", "--db"]
    )
    assert hoisted == ["--db", "a.db", "--no-embed", "search", "q", "-k", "3", "--json", "--", "--db"]
    assert hoist_group_options(main, ["--db", "x", "stats"]) == ["--db", "x", "stats"]
    assert hoist_group_options(main, ["--no-embed"]) == ["--no-embed"]  # no command: left as it is
    assert hoist_group_options(main, ["search", "q", "--db"]) == ["search", "q", "--db"]  # no value: stays


def test_shell_completion_of_a_trailing_db_does_not_crash(tmp_path: Path) -> None:
    """Completing `clawvm search q --db ` raised in the option hoisting, inside click's completion."""
    env = {"COMP_WORDS": "clawvm search q --db ", "COMP_CWORD": "4", "_CLAWVM_COMPLETE": "bash_complete"}
    result = CliRunner().invoke(main, [], env=env, prog_name="clawvm")
    assert result.exit_code == 0 and "Traceback" not in result.output


@pytest.mark.parametrize("command", [["serve"], ["demo", "--dashboard"], ["mcp", "--http"]])
def test_a_port_outside_tcp_s_range_is_refused(tmp_path: Path, command: list[str]) -> None:
    """99999 used to reach the socket, which listened on 99999 mod 65536 while the log said 99999."""
    args = ["--db", str(tmp_path / "p.db"), "--no-embed", *command, "--port", "99999"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--port" in result.output and "<=x<=65535" in result.output  # 1 for demo


def test_add_reads_content_from_stdin_or_a_file(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    piped = "line one\nline two: the runner's disk was full\n"
    result = CliRunner().invoke(
        main, ["--db", str(db), "--no-embed", "add", "-", "--kind", "error"], input=piped
    )
    assert result.exit_code == 0, result.output
    # the line break that ends the last line (echo's, an editor's) is not part of the memory
    assert json.loads(run(db, "show", result.output.strip()))["content"] == piped.removesuffix("\n")
    note = tmp_path / "note.md"
    note.write_text("# Incident\n\nrotated the staging key ✓\n", encoding="utf-8")
    mid = run(db, "add", "--file", str(note), "--tag", "incident").strip()
    shown = json.loads(run(db, "show", mid))
    assert shown["content"] == "# Incident\n\nrotated the staging key ✓" and shown["tags"] == ["incident"]
    note.write_text("\ufeffsaved by an editor that marks UTF-8\n", encoding="utf-8")  # a byte-order mark
    assert json.loads(run(db, "show", run(db, "add", "--file", str(note)).strip()))["content"] == (
        "saved by an editor that marks UTF-8"
    )
    piped_json = '{"host": "ci-3", "disk_free_gb": 0.4}'
    result = CliRunner().invoke(
        main, ["--db", str(db), "--no-embed", "add", "-", "--json-content"], input=piped_json
    )
    assert result.exit_code == 0, result.output
    assert json.loads(json.loads(run(db, "show", result.output.strip()))["content"]) == json.loads(piped_json)
    for source, args in (("stdin", ["add", "-"]), (str(note), ["add", "--file", str(note)])):
        note.write_bytes(b"\xff\xfe not text")  # said "contains unpaired surrogates" from stdin
        result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *args], input=note.read_bytes())
        assert result.exit_code == 2 and f"{source} is not UTF-8 text" in result.output, result.output
    for wrong in (["add"], ["add", "both", "--file", str(note)]):  # no content, or two sources
        result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *wrong])
        assert result.exit_code == 2 and "content" in result.output and "Traceback" not in result.output
    assert json.loads(run(db, "stats"))["memories"] == 4


@pytest.mark.parametrize(
    ("missing", "args", "says"),
    [
        ("psycopg", ["--db", "postgresql://u@localhost/db", "reindex"], "pip install 'clawvm[postgres]'"),
        ("fastapi", ["demo", "--dashboard"], "pip install 'clawvm[server]'"),
        ("fastapi", ["serve"], "pip install 'clawvm[server]'"),
    ],
)
def test_a_command_whose_extra_is_not_installed_says_which_in_one_line(
    tmp_path: Path, missing: str, args: list[str], says: str
) -> None:
    """As after ``pip install clawvm`` without the extra: the import of its package fails."""
    launch = f"import sys; sys.modules[{missing!r}] = None; from clawvm.cli import main; main()"
    out = subprocess.run(
        [sys.executable, "-c", launch, "--db", str(tmp_path / "c.db"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_reindex_of_a_store_that_is_not_postgresql_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--db", str(tmp_path / "c.db"), "reindex"])
    assert result.exit_code == 2 and "pass --db postgresql://" in result.output
    assert "Traceback" not in result.output


def test_search_rejects_an_unknown_kind_like_add(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    run(db, "add", "disk full on build-07", "--kind", "error")
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "search", "disk", "--kind", "bogus"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "kind" in result.output and all(k.value in result.output for k in Kind)
    assert "disk full" in run(db, "search", "disk", "--kind", "error")
    assert run(db, "search", "disk", "--kind", "note").strip() == ""


def test_export_import_round_trip(tmp_path: Path) -> None:
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    run(
        src,
        "add",
        '{"url": "https://x.test", "n": 3}',
        "--json-content",
        "--kind",
        "tool_call",
        "--tool",
        "http",
    )
    run(src, "add", "a note", "--tag", "t1", "--tag", "t2")
    dump = tmp_path / "dump.jsonl"
    run(src, "export", "-o", str(dump))
    run(dst, "import", str(dump))
    dump2 = tmp_path / "dump2.jsonl"
    run(dst, "export", "-o", str(dump2))
    assert dump.read_text() == dump2.read_text()
    assert "imported 0" in run(dst, "import", str(dump))  # idempotent
    first = json.loads(dump.read_text().splitlines()[0])
    changed = tmp_path / "changed.jsonl"
    changed.write_text(json.dumps({**first, "content": '{"edited": "after the export"}'}) + "\n")
    out = run(dst, "import", str(changed))  # the same id, other content: kept as stored, and said so
    assert "imported 0 memories (1 already present)" in out and "1 of those differ from the file" in out
    assert first["id"] in out and json.loads(run(dst, "show", first["id"]))["content"] == first["content"]


def test_export_keeps_memories_past_their_expiry(tmp_path: Path) -> None:
    """A backup holds everything: a memory stored expired, and one that expired since (no tick marked it),
    which reading active memories leaves out."""
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    then = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)  # long before the export runs
    with Harness.open(src, embedder=None, clock=lambda: then) as h:
        kept = h.record("the staging password rotates weekly")
        stored_expired = h.record("a one-hour token", expires_at=then - timedelta(hours=1))
        due_since = h.record("the freeze ends Friday", expires_at=then + timedelta(days=3))
    dump = tmp_path / "dump.jsonl"
    run(src, "export", "-o", str(dump))
    exported = {json.loads(line)["id"]: json.loads(line)["status"] for line in dump.read_text().splitlines()}
    assert exported == {kept.id: "active", stored_expired.id: "expired", due_since.id: "active"}
    run(dst, "import", str(dump))
    dump2 = tmp_path / "dump2.jsonl"
    run(dst, "export", "-o", str(dump2))
    assert dump.read_text() == dump2.read_text()


def test_import_of_a_bad_file_imports_nothing(tmp_path: Path) -> None:
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    run(src, "add", "first")
    dump = tmp_path / "dump.jsonl"
    run(src, "export", "-o", str(dump))
    lines = dump.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["id"] = "01a2b3c4-0000-7000-8000-000000000001"
    bad["kind"] = "nonsense"
    dump.write_text("\n".join([*lines, json.dumps(bad)]) + "\n")
    result = CliRunner().invoke(main, ["--db", str(dst), "--no-embed", "import", str(dump)])
    assert result.exit_code == 2
    assert f"{dump}:2: kind" in result.output
    assert not dst.exists()  # every line is checked before the store is opened: not even a file is made
    dump.write_text("\n".join([*lines, "", lines[0]]) + "\n")  # the same memory twice
    result = CliRunner().invoke(main, ["--db", str(dst), "--no-embed", "import", str(dump)])
    assert result.exit_code == 2 and f"{dump}:3: id" in result.output and "line 1" in result.output
    assert not dst.exists()


# any text a memory may hold: no lone surrogates (refused at record)
texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80).filter(
    lambda s: s.strip()
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    contents=st.lists(texts, min_size=1, max_size=5),
    tags=st.lists(st.sampled_from(["a", "b", "ü"]), max_size=3),
)
def test_jsonl_round_trip_is_lossless(
    tmp_path_factory: pytest.TempPathFactory, contents: list[str], tags: list[str]
) -> None:
    base = tmp_path_factory.mktemp("rt")
    src, dst = base / "a.db", base / "b.db"
    for c in contents:
        tag_args = [a for t in tags for a in ("--tag", t)]
        if c == "-":  # a lone "-" means standard input: that is how such a content is given
            run(src, "add", *tag_args, "-", stdin=c)
        else:
            run(src, "add", *tag_args, "--", c)  # "--": content may start with a dash
    dump, dump2 = base / "d1.jsonl", base / "d2.jsonl"
    run(src, "export", "-o", str(dump))
    run(dst, "import", str(dump))
    run(dst, "export", "-o", str(dump2))
    assert dump.read_bytes() == dump2.read_bytes()
    assert dump.read_bytes().count(b"\n") == len(contents)  # one line each, whatever the text holds


def test_stats_and_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    out = run(db, "demo")
    assert "questions had their evidence" in out
    stats = json.loads(run(db, "stats"))
    assert stats["memories"] > 100 and stats["sessions"] == 5
    assert stats["by_kind"]["tool_call"] == stats["by_kind"]["tool_result"]


def test_stats_counts_each_kind_status_and_tier_and_what_waits_for_a_vector(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    h = Harness.open(db, embedder=None)
    try:
        kept = h.record("the runner's disk was full", kind="error", session_id="a")
        h.record("retry with a bigger disk", kind="decision", session_id="a")
        h.record("disk is fine now", kind="observation", session_id="b", embedding=np.ones(384))
        h.update(kept.id, status="archived")
        h.record("due soon", expires_at=datetime.now(UTC) + timedelta(milliseconds=200))
        # an empty session id, as files written before record() refused one may hold: no session
        older = {"id": str(uuid.uuid4()), "session_id": "", "version": 1}
        engine_of(h).put(h.get(kept.id).model_copy(update=older))
        time.sleep(0.3)  # past its expiry, not yet ticked: stored as active
    finally:
        h.close()
    stats = json.loads(run(db, "stats"))
    assert stats["memories"] == 5 and stats["sessions"] == 2 and stats["unembedded"] == 4
    assert stats["by_kind"] == {"observation": 1, "decision": 1, "error": 2, "note": 1}
    # as reads show them (the due one is expired, swept or not), as the server's stats: they add up
    assert stats["by_status"] == {"active": 2, "archived": 2, "expired": 1}
    assert sum(stats["by_tier"].values()) == 5 and stats["events"] >= 5


def test_stats_totals_agree_while_another_process_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits before each of stats' reads of the file: the total, the sums by kind, status
    and tier came from one count each, saw different files, and disagreed (4 of 10 outputs in a trial with a
    writer process); they come from one read now."""
    db = tmp_path / "busy.db"
    writer = Harness.open(db, embedder=None)
    writing = False

    def committed_first(read: Any) -> Any:
        def then_read(store: SQLiteStore, *args: Any, **kwargs: Any) -> Any:
            nonlocal writing
            if not writing and store is not engine_of(writer):  # the writer's own reads write nothing
                writing = True
                try:
                    writer.record("meanwhile, in another process", kind="observation", tier="long_term")
                finally:
                    writing = False
            return read(store, *args, **kwargs)

        return then_read

    try:
        writer.record("first", kind="error")
        for name in ("count", "group_counts", "page", "query"):  # each read the engine has
            if hasattr(SQLiteStore, name):
                monkeypatch.setattr(SQLiteStore, name, committed_first(getattr(SQLiteStore, name)))
        stats = json.loads(run(db, "stats"))
    finally:
        writer.close()
    totals = [sum(stats[by].values()) for by in ("by_kind", "by_status", "by_tier")]
    assert totals == [stats["memories"]] * 3, stats


# ---- serve: redaction on by default, kept originals for admins ---------------------------------------------
SECRET = "mail ann@example.org, card 4111 1111 1111 1111"


@contextmanager
def served(db: Path, *flags: str, env: dict[str, str]) -> Iterator[str]:
    """``clawvm serve`` as a real process on a loopback port; yields its base URL once it is ready."""
    server = ServeProcess.start(str(db), db.with_suffix(".log"), *flags, env=env)
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


def admin_key(db: Path) -> dict[str, str]:
    store = SQLiteStore(db)
    store.setup()
    try:
        return {"Authorization": f"Bearer {Keyring(store).create('acme', 'admin')[1]}"}
    finally:
        store.close()


def test_serve_redacts_by_default_and_admins_read_kept_originals(tmp_path: Path) -> None:
    db = tmp_path / "kept.db"
    admin = admin_key(db)
    with served(db, "--keep-originals", env={KEY_ENV: DataKey.generate().encode()}) as url:
        m = httpx.post(f"{url}/v1/memories", json={"content": SECRET}, headers=admin).json()
        assert "ann@example.org" not in m["content"] and "4111" not in m["content"]
        original = httpx.get(f"{url}/v1/memories/{m['id']}/original", headers=admin)
        assert original.status_code == 200 and original.json()["content"] == SECRET


def test_serve_no_redact_stores_content_as_sent(tmp_path: Path) -> None:
    db = tmp_path / "plain.db"
    admin = admin_key(db)
    with served(db, "--no-redact", env={}) as url:
        m = httpx.post(f"{url}/v1/memories", json={"content": SECRET}, headers=admin).json()
        assert m["content"] == SECRET


def test_the_command_line_redacts_what_it_writes_when_asked_as_serve_does(tmp_path: Path) -> None:
    """`add` and `import` could only store a mail address and a card number in clear, in a store whose
    server redacts the same tenant's writes. Asked (--redact, or CLAWVM_REDACT=1), they redact; unasked,
    a command leaves stored text as it is (a tracked search wrote redacted text over the SDK's)."""
    db, plain = tmp_path / "shared.db", tmp_path / "plain.db"
    added = json.loads(run(db, "show", run(db, "--redact", "add", SECRET).strip()))["content"]
    assert "ann@example.org" not in added and "4111" not in added and "[EMAIL]" in added
    mid = run(plain, "add", SECRET).strip()
    run(plain, "search", "--track", "mail card")
    assert json.loads(run(plain, "show", mid))["content"] == SECRET
    imported = tmp_path / "imported.db"
    result = CliRunner(env={"CLAWVM_REDACT": "1"}).invoke(
        main, ["--db", str(imported), "--no-embed", "import", "-"], input=run(plain, "export")
    )
    assert result.exit_code == 0 and result.output.startswith("imported 1 memory "), result.output
    assert "ann@example.org" not in run(imported, "export") and "4111" not in run(imported, "export")


def test_serve_refuses_to_keep_originals_without_a_data_key(tmp_path: Path) -> None:
    runner = CliRunner(env={KEY_ENV: None, KEY_FILE_ENV: None})
    args = ["--db", str(tmp_path / "s.db"), "--no-embed", "serve", "--keep-originals"]
    result = runner.invoke(main, args)
    assert result.exit_code == 2 and KEY_ENV in result.output and KEY_FILE_ENV in result.output
    result = runner.invoke(main, [*args, "--no-redact"])
    assert result.exit_code == 2 and "--redact" in result.output


def test_a_server_tenants_export_is_read_with_its_tenant(tmp_path: Path) -> None:
    """`clawvm import` of a server tenant's export said "imported 13 memories", and no command showed them:
    they were stored under the tenant, and the CLI reads the default one."""
    source, db = tmp_path / "server.db", tmp_path / "local.db"
    with Harness.open(source, tenant="acme", embedder=None) as acme:
        acme.record("the acme deploy runs at noon", session_id="s")
    dump = tmp_path / "acme.jsonl"
    run(source, "--tenant", "acme", "export", "-o", str(dump))
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "import", str(dump)])
    assert result.exit_code == 0 and "--tenant acme" in result.output
    assert json.loads(run(db, "stats"))["memories"] == 0
    assert json.loads(run(db, "--tenant", "acme", "stats"))["memories"] == 1
    assert "acme deploy" in run(db, "--tenant", "acme", "search", "deploy noon")
    result = CliRunner().invoke(
        main, ["--db", str(db), "--no-embed", "--tenant", "globex", "import", str(dump)]
    )
    assert result.exit_code == 0 and "imported into tenant 'globex'" in result.output
    assert "acme deploy" in run(db, "--tenant", "globex", "search", "deploy noon")
    bad = tmp_path / "bad.jsonl"  # a pinned memory outside working, moved into another tenant: refused
    row = json.loads(dump.read_text().splitlines()[0])
    bad.write_text("\n" + json.dumps({**row, "pinned": True, "tier": "archive"}) + "\n")
    result = CliRunner().invoke(
        main, ["--db", str(db), "--no-embed", "--tenant", "initech", "import", str(bad)]
    )
    assert result.exit_code == 2 and f"{bad}:2: pinned" in result.output, result.output
    result = CliRunner().invoke(
        main, ["--db", str(db), "--tenant", "acme", "prune-events", "--max-events", "1"]
    )
    assert result.exit_code == 2 and "without --tenant" in result.output
    for unusable in (" ", "acme corp"):  # the second one no API key could name: the server never serves it
        result = CliRunner().invoke(main, ["--db", str(db), "--tenant", unusable, "stats"])
        assert result.exit_code == 2 and "--tenant" in result.output and "name" in result.output


@pytest.mark.parametrize(
    "command",
    [
        ["export", "--out"],
        ["export", "--events", "--out"],
        ["export", "--events", "--format", "parquet", "--out"],
        ["replay", "s1", "--json"],
    ],
)
@pytest.mark.parametrize(
    "out",
    ["t.db", "./t.db", "sub/../t.db", "link.db", "t.db-wal", "t.db-shm", "t.db.index", "t.db.index.1.2.tmp"],
)
def test_an_output_file_that_is_the_store_or_beside_it_is_refused_before_it_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], out: str
) -> None:
    """`export -o t.db` on the store t.db (or its log, its index snapshot, a link to it) emptied the store
    to 0 bytes before failing: the output was opened for writing first."""
    monkeypatch.chdir(tmp_path)
    run(Path("t.db"), "add", "a note", "--session", "s1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.db").symlink_to("t.db")
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    result = CliRunner().invoke(main, ["--db", "t.db", "--no-embed", *command, out])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {command[-1]}: ") and "write to another file" in result.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()} == files


class BacklogEmbedder:
    """A cheap stand-in for the default model that keeps what it embedded: stored texts and queries apart."""

    name = "backlog"
    dim = 384

    def __init__(self) -> None:
        self.stored: list[str] = []
        self.queries: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.stored += texts
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        out[:, 0] = 1.0
        return out

    def embed_query(self, text: str) -> np.ndarray:
        self.queries.append(text)
        out = np.zeros(self.dim, dtype=np.float32)
        out[0] = 1.0
        return out


def test_a_search_embeds_its_query_not_the_backlog_and_an_add_embeds_what_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`clawvm search` on a store of 3,000 memories without vectors embedded and wrote all of them (and
    waited for it on close, ~10 s): a look that only reads leaves them waiting; a write embeds before exit."""
    embedder = BacklogEmbedder()
    monkeypatch.setattr("clawvm.harness.facade._default_embedder", lambda: embedder)
    db = tmp_path / "b.db"
    for i in range(3):
        run(db, "add", f"deploy note {i}")  # --no-embed: they wait for vectors
    with_model = ["--db", str(db)]
    result = CliRunner().invoke(main, [*with_model, "search", "deploy"], catch_exceptions=False)
    assert result.exit_code == 0 and "deploy note 0" in result.output
    assert embedder.queries == ["deploy"] and embedder.stored == []
    assert json.loads(run(db, "stats"))["unembedded"] == 3
    result = CliRunner().invoke(main, [*with_model, "add", "deploy note 3"], catch_exceptions=False)
    assert result.exit_code == 0
    assert sorted(embedder.stored) == [f"deploy note {i}" for i in range(4)]
    assert json.loads(run(db, "stats"))["unembedded"] == 0


def test_migrate_refuses_a_batch_under_one_and_a_wrong_dimension_before_making_the_target(
    tmp_path: Path,
) -> None:
    """`--batch 0` failed with an IndexError and left an empty target; `--dim 10` on a store of 384-dim
    vectors failed with a reshape's ValueError: both are one line, naming the option, and no target."""
    source = tmp_path / "a.db"
    with Harness.open(source, embedder=BacklogEmbedder()) as h:
        h.record("the deploy failed")
    target = tmp_path / "n.db"
    base = ["migrate", "--from", str(source), "--to", str(target)]
    result = CliRunner().invoke(main, [*base, "--batch", "0"])
    assert result.exit_code == 2 and "'--batch'" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, [*base, "--dim", "10"])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"error: --dim: is 10, but --from {source} holds 384-dimensional vectors (pass --dim 384)"
    )
    assert not target.exists()
    with pytest.raises(ValidationError, match="batch"):  # the library's own check, before any write
        migrate(store_from_url("memory://"), store_from_url("memory://"), batch=0)


@pytest.mark.parametrize("age", ["1e6", "1e10", "inf", "nan", "-1"])
def test_prune_events_refuses_an_age_past_the_calendar_by_name(tmp_path: Path, age: str) -> None:
    """`prune-events --max-age-days 1e6` (or 1e10, inf) overflowed the cutoff's date: a traceback."""
    db = tmp_path / "p.db"
    run(db, "add", "a note")
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "prune-events", "--max-age-days", age])
    assert result.exit_code == 2 and "--max-age-days" in result.output and "Traceback" not in result.output
    with pytest.raises(ValidationError, match="max_age_days"):  # the library bounds it too
        Retention(max_age_days=float(age))
    assert Retention(max_age_days=MAX_AGE_DAYS).max_age_days == MAX_AGE_DAYS


@pytest.mark.parametrize("depth", [65, 990, 5000])
def test_json_content_nested_past_the_decoder_s_stack_is_the_usual_too_deep_error(
    tmp_path: Path, depth: int
) -> None:
    """`add --json-content "[[[...]]]"` 990 deep raised a RecursionError from the JSON decoder."""
    db = tmp_path / "j.db"
    result = CliRunner().invoke(
        main, ["--db", str(db), "--no-embed", "add", "-", "--json-content"], input="[" * depth + "]" * depth
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.startswith("error: content: is nested deeper than 64 levels (")


@pytest.mark.parametrize(("reads", "memories"), [("one line", 300), ("nothing", 1)])
def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(
    tmp_path: Path, reads: str, memories: int
) -> None:
    """`clawvm export | head -1` exited 1 (click's broken-pipe handling); a reader gone before a short output
    was flushed left the interpreter's "Exception ignored" lines on stderr: exit 0, nothing on stderr."""
    db = tmp_path / "big.db"
    with Harness.open(db, embedder=None) as h:  # 300: more than a pipe holds, the export waits on the reader
        for i in range(memories):
            h.record(f"memory {i} " + "x" * 400)
    command = [sys.executable, "-m", "clawvm.cli", "--db", str(db), "--no-embed", "export"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        if reads == "one line":
            assert json.loads(proc.stdout.readline())["content"].startswith("memory ")
        proc.stdout.close()  # "nothing": closed while the command still starts, before it writes
        errors = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, errors
    assert errors == b""


def test_a_tenant_from_the_environment_is_named_as_such(tmp_path: Path) -> None:
    """`CLAWVM_TENANT=acme clawvm prune-events` said "run it without --tenant", which was never given; a bad
    CLAWVM_TENANT was reported as a bad --tenant."""
    db = tmp_path / "t.db"
    run(db, "add", "a note")
    prune = ["--db", str(db), "--no-embed", "prune-events", "--max-events", "1"]
    result = CliRunner().invoke(main, prune, env={"CLAWVM_TENANT": "acme"})
    assert result.exit_code == 2 and "tenant 'acme' is set" in result.output
    assert "without --tenant and without CLAWVM_TENANT" in result.output
    for wrong in ("a b", " "):
        result = CliRunner().invoke(main, ["--db", str(db), "stats"], env={"CLAWVM_TENANT": wrong})
        assert result.exit_code == 2 and "Invalid value for CLAWVM_TENANT" in result.output
        result = CliRunner().invoke(main, ["--db", str(db), "--tenant", wrong, "stats"])
        assert result.exit_code == 2 and "Invalid value for --tenant" in result.output


def test_import_reads_stdin_for_a_dash_as_add_does(tmp_path: Path) -> None:
    """`add -` read stdin, `import -` said there was no file named "-"."""
    source, copy = tmp_path / "a.db", tmp_path / "b.db"
    mid = run(source, "add", "the deploy failed").strip()
    dump = run(source, "export")
    assert run(copy, "import", "-", stdin=dump).startswith("imported 1 memory ")
    assert json.loads(run(copy, "show", mid))["content"] == "the deploy failed"
    result = CliRunner().invoke(main, ["--db", str(copy), "--no-embed", "import", "-"], input=dump + "oops\n")
    assert result.exit_code == 2 and result.output.startswith("error: <stdin>:2: ")


def test_only_a_broken_stdout_is_a_reader_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every BrokenPipeError ended the command with exit 0: one from a socket or a child process too."""
    from clawvm.cli.common import _stdout_closed

    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not _stdout_closed()  # its reader is there: another pipe broke
        os.close(read_end)
        assert _stdout_closed()


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_id_option_is_refused_by_name_and_writes_nothing(tmp_path: Path, blank: str) -> None:
    """`clawvm add t --session "$S"` with S unset printed an id and filed the memory under no session (the
    REST API answers 422, and `--tag ""` was refused); `keys list --tenant ""` listed nothing. Every id
    option refuses a blank value, naming the option and the fix, before any store opens."""
    fresh = tmp_path / "fresh.db"
    result = CliRunner().invoke(main, ["--db", str(fresh), "--no-embed", "add", "t", "--session", blank])
    assert result.exit_code == 2 and "--session: is blank" in result.output, result.output
    assert not fresh.exists()
    db = tmp_path / "c.db"
    run(db, "add", "keep me")
    for args in (
        ["add", "t", "--session"],
        ["add", "t", "--task"],
        ["add", "t", "--agent"],
        ["add", "t", "--tool"],
        ["search", "q", "--session"],
        ["export", "--session"],
        ["review", "list", "--team"],
        ["review", "list", "--agent"],
        ["review", "reject", "x", "--by"],
        ["keys", "list", "--tenant"],
        ["keys", "create", "--tenant"],
    ):
        result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *args, blank])
        option = args[-1]
        assert result.exit_code == 2, (args, result.output)
        assert f"{option}: is blank" in result.output, result.output
        assert f"leave {option} out" in result.output, result.output
    assert json.loads(run(db, "stats"))["memories"] == 1


def test_a_json_key_given_twice_is_refused_naming_it_as_the_rest_api_does(tmp_path: Path) -> None:
    """`import` of `{"content": "first", "content": "second"}` stored "second" and `add '{"a": 1, "a": 2}'
    --json-content` stored {"a": 2}: Python's JSON reader keeps the last value without a word, where the
    REST API refuses a key given twice (422). Both refuse it, naming the key (and line), writing nothing."""
    db = tmp_path / "c.db"
    src = tmp_path / "a.db"
    run(src, "add", "a note")
    good = run(src, "export").strip()
    memory = json.loads(good)
    twice = good.replace('"content":', '"content":"first","content":', 1)
    assert json.loads(twice)["content"] == memory["content"]  # the last value is the one that was kept
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "import", "-"], input=f"\n{twice}\n")
    assert result.exit_code == 2, result.output
    assert "<stdin>:2: content: is given more than once in one JSON object" in result.output
    assert "give each key once" in result.output and not db.exists()
    nested = good.replace('"metadata":{}', '"metadata":{"a":1,"a":2}')
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "import", "-"], input=nested)
    assert result.exit_code == 2, result.output
    assert "<stdin>:1: metadata.a: is given more than once" in result.output, result.output  # its path
    for content, path in [('{"a": 1, "a": 2}', "a"), ('[{"b": {"a": 1, "a": 2}}]', "0.b.a")]:
        result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "add", content, "--json-content"])
        assert result.exit_code == 2, result.output
        assert f"content.{path}: is given more than once" in result.output, result.output
    assert not db.exists()
    assert run(db, "import", "-", stdin=good).startswith("imported 1")  # once each: imported


def test_counts_are_in_the_singular_for_one_and_a_second_revoke_says_it_changed_nothing(
    tmp_path: Path,
) -> None:
    """"imported 1 memories"; `keys revoke` of a revoked key printed "revoked ..." again as if it had; and a
    memory or key not found was told without what to do, unlike the REST API."""
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    run(src, "add", "one note")
    dump = tmp_path / "dump.jsonl"
    assert CliRunner().invoke(main, ["--db", str(src), "export", "-o", str(dump)]).stderr.startswith(
        "exported 1 memory to"
    )
    assert run(dst, "import", str(dump)).startswith("imported 1 memory (0 already present)")
    assert run(dst, "import", str(dump)).startswith("imported 0 memories (1 already present)")
    token = run(dst, "keys", "create", "--tenant", "acme").splitlines()[0]
    key_id = token.split("_")[1]
    assert run(dst, "keys", "revoke", key_id) == f"revoked {key_id}\n"
    again = run(dst, "keys", "revoke", key_id)  # idempotent: exit 0, and says so
    assert again.startswith(f"{key_id} was already revoked at ") and "nothing changed" in again
    for args, fix in (
        (["show", str(uuid.uuid4())], "`clawvm list`, `clawvm export` or `clawvm search QUERY` show the ids"),
        (["review", "reject", str(uuid.uuid4())], "`clawvm list`, `clawvm export` or `clawvm search QUERY`"),
        (["keys", "revoke", "0123456789ab"], "`clawvm keys list --all` lists every key"),
    ):
        result = CliRunner().invoke(main, ["--db", str(dst), "--no-embed", *args])
        assert result.exit_code == 2 and "not found (check the" in result.output, result.output
        assert fix in result.output, result.output


def fails(db: Path, *args: str, stdin: str | None = None) -> str:
    """The one line a command that must fail prints (exit 2, no traceback)."""
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *args], input=stdin)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    return result.output


def stdout_of(db: Path, *args: str) -> str:
    """What a command that succeeds prints on standard output alone (its notes go to stderr)."""
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_edit_changes_only_the_given_fields_and_a_stale_version_changes_nothing(tmp_path: Path) -> None:
    """Editing a memory was only possible through REST, the SDK or MCP: `edit` changes the fields given
    (as a PATCH does), its version grows by one, and bad input is one line naming the field and the fix."""
    db = tmp_path / "c.db"
    mid = run(db, "add", "deploy failed", "--kind", "error", "--session", "ops", "--tag", "ci").strip()
    assert run(db, "edit", mid, "--content", "deploy failed: disk full", "--tag", "ci", "--tag", "disk") == (
        f"updated {mid} (version 2)\n"
    )
    shown = json.loads(run(db, "show", mid))
    assert (shown["content"], shown["tags"], shown["version"]) == (
        "deploy failed: disk full",
        ["ci", "disk"],
        2,
    )
    assert (shown["kind"], shown["session_id"]) == ("error", "ops")  # not given: as they were
    assert "nothing changed (version 2)" in run(db, "edit", mid, "--kind", "error")
    run(db, "edit", mid, "--content", "-", "--json-content", "--status", "archived", stdin='{"disk": 0}')
    shown = json.loads(run(db, "show", mid))
    assert (shown["content_type"], shown["status"], shown["version"]) == ("application/json", "archived", 3)
    run(db, "edit", mid, "--no-tags", "--expected-version", "3")
    assert json.loads(run(db, "show", mid))["tags"] == []

    stale = fails(db, "edit", mid, "--kind", "decision", "--expected-version", "1")
    assert f"error: memory '{mid}' is at version 4, not 1" in stale
    unknown = fails(db, "edit", str(uuid.uuid4()), "--kind", "note")
    assert "not found" in unknown and "`clawvm list`" in unknown
    assert "edit: changes nothing" in fails(db, "edit", mid)
    assert "--status: is 'internal' (use one of active, archived, obsolete)" in fails(
        db, "edit", mid, "--status", "internal"
    )
    assert "kind:" in fails(db, "edit", mid, "--kind", "bogus")
    assert "give --content or --file, not both" in fails(
        db, "edit", mid, "--content", "x", "--file", str(Path(__file__))
    )
    assert "ID: is blank" in fails(db, "edit", " ", "--kind", "note")
    assert "--session: is blank" in fails(db, "edit", mid, "--session", "")
    assert json.loads(run(db, "show", mid))["version"] == 4  # none of them wrote


def test_pin_and_unpin_say_when_they_changed_nothing(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    mid = run(db, "add", "the on-call rota", "--session", "ops").strip()
    assert run(db, "pin", mid) == f"pinned {mid}\n"
    shown = json.loads(run(db, "show", mid))
    assert shown["pinned"] is True and shown["tier"] == "working"
    assert run(db, "pin", mid) == f"{mid} was already pinned: nothing changed\n"
    assert run(db, "unpin", mid) == f"unpinned {mid}\n"
    assert run(db, "unpin", mid) == f"{mid} was not pinned: nothing changed\n"
    assert json.loads(run(db, "show", mid))["pinned"] is False
    run(db, "edit", mid, "--status", "archived")
    assert "memory_id: is archived (only active memories can be pinned)" in fails(db, "pin", mid)
    assert "not found" in fails(db, "unpin", str(uuid.uuid4()))
    assert "ID: is blank" in fails(db, "pin", "")
    shown = json.loads(run(db, "show", mid))
    assert (shown["pinned"], shown["version"]) == (
        False,
        4,
    )  # pin, unpin, archive: the refusals wrote nothing


def test_list_prints_the_newest_memories_that_match(tmp_path: Path) -> None:
    """Listing without a query: `search` needs one, `export` writes every memory of every status."""
    db = tmp_path / "c.db"
    first = run(db, "add", "first note", "--session", "ops", "--tag", "ci").strip()
    second = run(db, "add", "a decision", "--kind", "decision", "--session", "ops").strip()
    other = run(db, "add", "elsewhere", "--session", "lunch").strip()
    lines = run(db, "list").splitlines()
    assert [line.split()[0] for line in lines] == [other, second, first]
    assert "[decision] a decision" in lines[1]
    assert [line.split()[0] for line in run(db, "list", "--session", "ops", "--limit", "1").splitlines()] == [
        second
    ]
    assert run(db, "list", "--kind", "decision").split()[0] == second
    assert run(db, "list", "--tag", "ci").split()[0] == first
    run(db, "pin", first)
    assert run(db, "list", "--pinned").split()[0] == first
    run(db, "edit", other, "--status", "archived")
    assert other not in run(db, "list")
    assert "[note, archived] elsewhere" in run(db, "list", "--status", "archived")
    assert len(run(db, "list", "--status", "any").splitlines()) == 3
    listed = [json.loads(line) for line in run(db, "list", "--json", "--session", "ops").splitlines()]
    assert [m["id"] for m in listed] == [second, first] and listed[1]["pinned"] is True
    assert "kind: is 'bogus' (use one of" in fails(db, "list", "--kind", "bogus")
    assert "status: has the unknown value 'bogus'" in fails(db, "list", "--status", "bogus")
    assert "--session: is blank" in fails(db, "list", "--session", "")


def test_checkpoint_checkpoints_and_rollback(tmp_path: Path) -> None:
    """A session's checkpoints were the SDK's, REST's and MCP's alone: `checkpoint` prints the id,
    `checkpoints` lists them, `rollback` prints what it restored and what it obsoleted."""
    db = tmp_path / "c.db"
    kept = run(db, "add", "the plan", "--session", "ops").strip()
    checkpoint_id = stdout_of(db, "checkpoint", "ops", "before the change").strip()
    listed = stdout_of(db, "checkpoints", "ops").splitlines()
    assert len(listed) == 1 and listed[0].startswith(checkpoint_id)
    assert listed[0].endswith("1 memory  before the change")
    run(db, "pin", kept)
    later = run(db, "add", "a wrong turn", "--session", "ops").strip()
    out = stdout_of(db, "rollback", checkpoint_id).splitlines()
    assert out[0] == f"rolled back to {checkpoint_id}: restored 1 memory, obsoleted 1 recorded since"
    assert out[1:] == [f"restored {kept}", f"obsoleted {later}"]
    assert json.loads(run(db, "show", kept))["pinned"] is False
    assert json.loads(run(db, "show", later))["status"] == "obsolete"
    again = json.loads(stdout_of(db, "rollback", checkpoint_id, "--json"))
    assert again == {"checkpoint_id": checkpoint_id, "restored": [], "obsoleted": []}
    (info,) = [json.loads(line) for line in stdout_of(db, "checkpoints", "ops", "--json").splitlines()]
    assert (info["id"], info["name"], info["memories"]) == (checkpoint_id, "before the change", 1)

    # a session with no memories may be checkpointed (before work starts), with a note for a mistyped one
    empty = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "checkpoint", "opps", "x"])
    assert empty.exit_code == 0 and "note: session 'opps' has no memories" in empty.stderr
    none = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "checkpoints", "nobody"])
    assert none.stdout == "" and "has no checkpoints" in none.stderr

    before = run(db, "export")
    not_one = fails(db, "rollback", kept)
    assert (
        f"CHECKPOINT_ID: {kept} is not a checkpoint" in not_one and "`clawvm checkpoints SESSION`" in not_one
    )
    unknown = fails(db, "rollback", str(uuid.uuid4()))
    assert "not found" in unknown and "`clawvm checkpoints SESSION` lists" in unknown
    assert "name: is ''" in fails(db, "checkpoint", "ops", "")
    blank = fails(db, "checkpoint", "", "x")
    assert "SESSION: is blank" in blank and "leave SESSION out" not in blank  # it is needed: no such fix
    assert "SESSION: is blank" in fails(db, "checkpoints", " ")
    assert "CHECKPOINT_ID: is blank" in fails(db, "rollback", "")
    assert run(db, "export") == before and len(stdout_of(db, "checkpoints", "ops").splitlines()) == 1
