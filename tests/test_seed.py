"""Cold start: seed files (YAML and JSON) import atomically, name file, line and field on errors, import
nothing when bad, and their rule templates add guidance when a task matches."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawvm import Harness, Kind, Status, ValidationError
from clawvm.cli import main as cli
from clawvm.core.model import Scope
from clawvm.teams import shared as teams
from clawvm.teams.seed import import_seed, parse
from engines import harness_target

GOOD = """\
version: 1
team: payments
memories:
  - kind: knowledge
    content: Refunds over 500 EUR need a second approval.
    task_type: refund
    subject: refund approval
    tags: [billing]
  - kind: decision
    content: The ledger runs on Postgres 16.
    agent: planner
    confidence: 0.4
  - kind: observation
    content: Planner notes on the ledger migration.
    scope: private
    agent: planner
  - kind: error
    content: The refund job timed out at 30 s on month end.
    scope: task
    task: t-7
rules:
  - guidance: Run the database migrations before deploying.
    task_type: deploy
  - guidance: Never log card numbers.
    keywords: [card, "payment id"]
"""


@pytest.fixture
def lexical(engine_name: str, tmp_path: Path) -> Iterator[Harness]:
    h = Harness.open(harness_target(engine_name, tmp_path, "seed.db"), embedder=None)
    try:
        h.grant("payments", "writer")
        yield h
    finally:
        h.close()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_seed_file_imports_once_with_its_scopes(engine_name: str, lexical: Harness, tmp_path: Path) -> None:
    path = write(tmp_path, "seed.yaml", GOOD)
    report = import_seed(lexical, path)
    assert (report.memories, report.rules, report.imported) == (4, 2, 6)
    assert import_seed(lexical, path).imported == 0  # the same file twice adds nothing
    by_content = {m.content: m for m in lexical.list(limit=100)}
    refund = by_content["Refunds over 500 EUR need a second approval."]
    assert (refund.kind, refund.scope, refund.team_id) == (Kind.KNOWLEDGE, Scope.TEAM, "payments")
    assert refund.metadata["subject"] == "refund approval" and refund.metadata["seed"]["line"] == 4
    assert set(refund.tags) == {"billing", teams.task_type_tag("refund")}
    private = by_content["Planner notes on the ledger migration."]
    assert (private.scope, private.agent_id) == (Scope.PRIVATE, "planner")
    task = by_content["The refund job timed out at 30 s on month end."]
    assert (task.scope, task.task_id, task.team_id) == (Scope.TASK, "t-7", "payments")
    writer = teams.visibility(lexical, "writer")
    assert private.id not in {m.id for m in lexical.list(visible_to=writer, limit=100)}
    low = by_content["The ledger runs on Postgres 16."]
    assert [m.id for m in lexical.review_queue()] == [low.id]  # low confidence waits for review


def test_json_seed_is_equivalent(engine_name: str, lexical: Harness, tmp_path: Path) -> None:
    as_json = write(tmp_path, "seed.json", json.dumps(yaml.safe_load(GOOD), indent=2))
    as_yaml = write(tmp_path, "seed.yaml", GOOD)
    from_json, from_yaml = parse(as_json).memories, parse(as_yaml).memories
    assert [m.id for m in from_json] == [m.id for m in from_yaml]
    assert [m.content for m in from_json] == [m.content for m in from_yaml]
    import_seed(lexical, as_json)
    assert import_seed(lexical, as_yaml).imported == 0


def test_rule_templates_add_guidance_when_the_task_matches(
    engine_name: str, lexical: Harness, tmp_path: Path
) -> None:
    import_seed(lexical, write(tmp_path, "seed.yaml", GOOD))
    deploy = lexical.guidance("writer", "Ship the refunds service", 300, task_type="deploy")
    assert [i.line.split("] ", 1)[1] for i in deploy.rules] == [
        "rule: Run the database migrations before deploying."
    ]
    assert deploy.text.startswith("Team rules:")
    cards = lexical.guidance("writer", "Export the card payments report", 300)
    assert [i.line.endswith("Never log card numbers.") for i in cards.rules] == [True]
    phrase = lexical.guidance("writer", "Look up a Payment ID for support", 300)
    assert len(phrase.rules) == 1
    neither = lexical.guidance("writer", "Write the quarterly summary", 300, task_type="report")
    assert neither.rules == []
    assert lexical.guidance("stranger", "Export card data", 300).rules == []  # team rules need the team
    # a rule whose words a recall finds, but whose type and keywords do not match, is no rule for the task
    words = lexical.guidance("writer", "Back up the database before the migrations freeze", 300)
    assert words.rules == [] and all("Run the database migrations" not in i.line for i in words.items)


# file text, expected line, expected field
BAD = [
    (
        "memories:\n  - kind: knowledge\n    content: ok\n  - kind: decision\n    content: x\n"
        "    confidence: 1.7\n",
        6,
        "memories[1].confidence",
    ),
    ("memories:\n  - kind: decisionx\n    content: x\n", 2, "memories[0].kind"),
    ("memories:\n  - kind: note\n    content: x\n", 2, "memories[0].kind"),
    ("memories:\n  - kind: knowledge\n", 2, "memories[0]"),
    ("memories:\n  - kind: knowledge\n    content: x\n    colour: red\n", 4, "memories[0].colour"),
    ("memories:\n  - kind: knowledge\n    content: x\n    scope: private\n", 2, "memories[0].agent"),
    ("memories:\n  - kind: knowledge\n    content: x\n    scope: task\n", 2, "memories[0].task"),
    ("memories:\n  - kind: knowledge\n    content: x\n    scope: galaxy\n", 4, "memories[0].scope"),
    ("memories:\n  - kind: knowledge\n    content: x\n    tags: oops\n", 4, "memories[0].tags"),
    ("rules:\n  - guidance: do it\n", 2, "rules[0]"),
    ("rules:\n  - guidance: do it\n    keywords: [1, 2]\n", 3, "rules[0].keywords"),
    ("memories: {}\n", 1, "memories"),
    ("version: 2\n", 1, "version"),
    ("colour: red\n", 1, "colour"),
    ("- just a list\n", 1, "file"),
    ("memories:\n  - kind: knowledge\n    content: [unclosed\n", 4, "file"),
    # YAML reads true as a boolean, which a number field would take as 1.0
    ("memories:\n  - kind: knowledge\n    content: x\n    confidence: true\n", 4, "memories[0].confidence"),
    # a second content would silently replace the first
    ("memories:\n  - kind: knowledge\n    content: x\n    content: y\n", 3, "memories[0].content"),
    ("team: a\nmemories: []\nteam: b\n", 1, "team"),
]


@pytest.mark.parametrize(("text", "line", "field"), BAD)
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ValidationError) as err:
        parse(path)
    assert err.value.field == f"{path}:{line}: {field}"


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        (
            '{"memories": [\n {"kind": "knowledge", "content": "ok"},\n {"kind": "decisionx",\n'
            '  "content": "x"}\n]}',
            3,
            "memories[1].kind",
        ),
        (
            '{"memories": [\n {"kind": "knowledge",\n  "content": "ok",\n  "confidence": -1}]}',
            4,
            "memories[0].confidence",
        ),
        ('{"memories": [\n {"kind": "knowledge", "content": "ok"},\n]}', 3, "file"),  # trailing comma
        (
            '{"memories": [\n {"kind": "knowledge",\n  "content": "ok",\n  "content": "no"}]}',
            3,
            "memories[0].content",
        ),
    ],
)
def test_json_errors_name_line_and_field(tmp_path: Path, text: str, line: int, field: str) -> None:
    path = write(tmp_path, "bad.json", text)
    with pytest.raises(ValidationError) as err:
        parse(path)
    assert err.value.field == f"{path}:{line}: {field}"


def test_other_suffixes_and_unreadable_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="suffix"):
        parse(write(tmp_path, "seed.txt", GOOD))
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("content: caf\xe9".encode("latin-1"))
    with pytest.raises(ValidationError) as err:
        parse(bad)
    assert err.value.field == f"{bad}:1: file"


CORRUPTIONS: list[tuple[str, Any]] = [
    ("kind", "notakind"),
    ("content", ""),
    ("confidence", 2),
    ("scope", "nowhere"),
    ("tags", "x"),
    ("unknown_field", 1),
    ("agent", 7),
]


@pytest.mark.engines("memory", "sqlite")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.integers(0, 3), corruption=st.sampled_from(CORRUPTIONS))
def test_a_bad_entry_anywhere_imports_nothing(
    engine_name: str, tmp_path: Path, entry: int, corruption: tuple[str, Any]
) -> None:
    doc = yaml.safe_load(GOOD)
    key, value = corruption
    doc["memories"][entry][key] = value
    path = write(tmp_path, "bad.yaml", yaml.safe_dump(doc, sort_keys=False))
    target = harness_target(engine_name, tmp_path, f"atomic-{entry}-{key}.db")
    with Harness.open(target, embedder=None) as h:
        before = h.count(status="any")
        with pytest.raises(ValidationError) as err:
            import_seed(h, path)
        assert f"memories[{entry}]" in err.value.field
        assert h.count(status="any") == before


def test_cli_seed_imports_a_file(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    path = write(tmp_path, "seed.yaml", GOOD)
    result = CliRunner().invoke(cli, ["--db", str(db), "--no-embed", "seed", str(path)])
    assert result.exit_code == 0, result.output
    assert "imported 6" in result.output
    with Harness.open(str(db), embedder=None) as h:
        assert h.count(kind=Kind.KNOWLEDGE, status=Status.ACTIVE) == 3  # one memory, two rules
    bad = write(tmp_path, "bad.yaml", "memories:\n  - kind: knowledge\n")
    result = CliRunner().invoke(cli, ["--db", str(db), "--no-embed", "seed", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: memories[0]" in result.output
