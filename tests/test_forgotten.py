"""A forgotten memory's text leaves the team memories made from it (:mod:`clawvm.teams.forgotten`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clawvm import Harness, Status
from clawvm.teams import shared as teams
from clawvm.teams.forgotten import FORGOTTEN
from clawvm.teams.merge import merge_team
from engines import harness_target

SECRET_SIDE = "Refunds go to the card of the customer, account number 5506 ending in 13000"
OTHER_SIDE = "Refunds go to store credit"
SECRET_ERROR = "Login failed for user ops-admin with password hunter2 on the ledger service"
OTHER_ERROR = "Login failed for user ops-admin on the ledger service"


@pytest.fixture
def h(engine_name: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness.open(harness_target(engine_name, tmp_path), embedder=None)
    harness.grant("pay", "planner", write=True)
    try:
        yield harness
    finally:
        harness.close()


def _held_anywhere(h: Harness, text: str) -> list[str]:
    """The kinds of the memories that still hold ``text`` (in their content or metadata)."""
    return [m.kind.value for m in h.list(status="any", limit=100) if text in m.content + str(m.metadata)]


def test_a_forgotten_side_leaves_its_conflict_note(h: Harness) -> None:
    """The note quoted each side's text: forgotten, the side was still read in the note (closed, but
    listed and recalled with its status)."""
    sides = [
        teams.record(
            h, text, agent_id="planner", team_id="pay", kind="decision", metadata={"subject": "refund"}
        )
        for text in (SECRET_SIDE, OTHER_SIDE)
    ]
    [note_id] = merge_team(h, team_id="pay").conflicts
    h.forget(sides[0].id)
    assert _held_anywhere(h, "account number") == []
    note = h.get(note_id)
    assert note.status is Status.ARCHIVED and teams.review_state(note) == "resolved"  # closed as before
    assert f"] {FORGOTTEN} <> [" in note.content and OTHER_SIDE in note.content


def test_a_forgotten_error_leaves_the_pitfall_made_from_it(h: Harness) -> None:
    """A pitfall kept each error as a sample and quoted the first: after the error was forgotten its
    text (a password) was in every guidance prompt the pitfall reached."""
    for n, text in enumerate([SECRET_ERROR, OTHER_ERROR]):
        teams.record(h, text, agent_id="planner", team_id="pay", kind="error", task_id=f"t{n}")
    [pitfall_id] = merge_team(h, team_id="pay").knowledge
    secret = next(m for m in h.list(status="any", kind="error") if "hunter2" in m.content)
    h.forget(secret.id)
    assert _held_anywhere(h, "hunter2") == []
    [pitfall] = h.list(team_id="pay", kind="knowledge")
    assert pitfall.metadata["samples"] == [OTHER_ERROR] and OTHER_ERROR in pitfall.content
    assert pitfall_id in {pitfall.id, teams.root_id(pitfall)}


def test_a_forgotten_error_leaves_the_pitfalls_earlier_revisions_too(h: Harness) -> None:
    """A later merge revises the pitfall: its obsolete revision kept the forgotten error as a sample, read
    by history() and any listing of obsolete memories after the forget."""
    for n, text in enumerate([SECRET_ERROR, OTHER_ERROR]):
        teams.record(h, text, agent_id="planner", team_id="pay", kind="error", task_id=f"t{n}")
    [first] = merge_team(h, team_id="pay").knowledge
    again = OTHER_ERROR + " again today"
    teams.record(h, again, agent_id="planner", team_id="pay", kind="error", task_id="t9")
    [head] = merge_team(h, team_id="pay").knowledge
    assert head != first and h.get(first).status is Status.OBSOLETE
    secret = next(m for m in h.list(status="any", kind="error") if "hunter2" in m.content)
    h.forget(secret.id)
    assert _held_anywhere(h, "hunter2") == []
    older = h.get(first)
    assert older.status is Status.OBSOLETE and older.metadata["samples"] == [OTHER_ERROR]
    assert [m.id for m in h.history(head)] == [first, head]  # the chain as it was
    update = h.events(memory_id=first)[-1]
    assert (update.kind, update.data["fields"]) == ("update", ["content", "metadata"])


def test_a_forgotten_error_whose_text_another_error_holds_or_contains_leaves_the_pitfall_whole(
    h: Harness,
) -> None:
    """The text was taken out by string replacement: a kept sample that contains the forgotten one was
    cut ("..., retry, retry"), and of two errors saying the same, forgetting one removed the sample the
    other still holds."""
    texts = [OTHER_ERROR, OTHER_ERROR + ", retry"]
    made = [
        teams.record(h, text, agent_id="planner", team_id="pay", kind="error", task_id=f"t{n}")
        for n, text in enumerate(texts)
    ]
    merge_team(h, team_id="pay")
    [pitfall] = h.list(team_id="pay", kind="knowledge")
    h.forget(made[0].id)
    [after] = h.list(team_id="pay", kind="knowledge")
    assert after.metadata["samples"] == [t for t in pitfall.metadata["samples"] if t != OTHER_ERROR]
    assert after.content.endswith(texts[1]) and ", retry, retry" not in after.content
    same = [
        teams.record(h, SECRET_ERROR, agent_id="planner", team_id="pay", kind="error", task_id=f"s{n}")
        for n in range(2)
    ]
    merge_team(h, team_id="pay")
    h.forget(same[0].id)
    assert SECRET_ERROR in str(h.list(team_id="pay", kind="knowledge")[0].metadata["samples"])
