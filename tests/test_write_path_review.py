"""Holes found by review in the one write path and the read-time rules, each kept closed by a test."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

import clawvm
from clawvm import Filters, Harness, NotFoundError, RedactionPolicy, Status, ValidationError
from clawvm.demo.scenario import ReplayClock
from clawvm.store.crypto import REDACTION_FIELD
from engines import engine_of

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
CARD = "4111111111111111"


def redacting(clock: ReplayClock | None = None) -> Harness:
    return Harness.open(
        "memory://", embedder=None, redaction=RedactionPolicy(), clock=clock or ReplayClock(T0)
    )


def test_a_verdict_on_metadata_never_answers_for_content() -> None:
    """Metadata numbers are not checked (a count stays a count), so its memo must not vouch for the same
    text arriving as content."""
    with redacting() as h:
        h.record("hello", session_id="s", metadata={"n": int(CARD)})
        stored = h.record('{"n": ' + CARD + "}", session_id="s")
        assert CARD not in stored.content and CARD not in h.get(stored.id).content


def test_a_revision_does_not_inherit_the_old_texts_redaction_mark() -> None:
    with redacting() as h:
        m = h.record("mail bob@example.com about the refund", kind="decision")
        assert REDACTION_FIELD in m.metadata
        n = h.revise(m.id, content="nothing personal here")
        assert REDACTION_FIELD not in n.metadata


def test_a_caller_cannot_forge_a_redaction_mark() -> None:
    with redacting() as h, pytest.raises(ValidationError) as err:
        h.record("plain text", metadata={REDACTION_FIELD: {"v": 1, "kinds": {"email": 9}}})
    assert err.value.field == f"metadata.{REDACTION_FIELD}"


@pytest.mark.parametrize("status", ["active", ("active",), {"active"}, ["active", "obsolete"]])
def test_every_spelling_of_active_leaves_out_what_is_due(status: object) -> None:
    clock = ReplayClock(T0)
    with Harness.open("memory://", embedder=None, clock=clock) as h:
        m = h.record("rotate the cache key at noon", expires_at=T0 + timedelta(hours=1))
        clock.advance(hours=2)  # due; no tick has run
        assert m.id not in [x.id for x in h.recall("cache key", status=status)]
        assert m.id not in [x.id for x in h.list(status=status)]
        assert m.id in [x.id for x in h.list(status="any")]


def test_a_due_memory_cannot_be_updated_or_pinned_back_to_life() -> None:
    clock = ReplayClock(T0)
    with Harness.open("memory://", embedder=None, clock=clock) as h:
        m = h.record("temporary password, valid 1 hour", expires_at=T0 + timedelta(hours=1), session_id="s")
        clock.advance(hours=2)
        for change in (lambda: h.update(m.id, expires_at=None), lambda: h.pin(m.id)):
            with pytest.raises(ValidationError, match="expired"):
                change()
        assert h.get(m.id).expires_at is not None


def test_internal_records_cannot_be_forgotten() -> None:
    with Harness.open("memory://", embedder=None) as h:
        h.grant("crew", "alice", write=True)
        grant = h.store.list(Filters.of(tenant=h.tenant, status="internal"), limit=1)
        assert grant and grant[0].status is Status.INTERNAL
        with pytest.raises(ValidationError, match="internal"):
            h.forget(grant[0].id)


def test_a_checkpoint_of_another_tenant_cannot_be_rolled_back() -> None:
    with Harness.open("memory://", embedder=None, tenant="acme") as acme:
        acme.record("acme fact", session_id="s1")
        cp = acme.checkpoint("s1", "before")
        globex = Harness(engine_of(acme), None, tenant="globex")
        with pytest.raises(NotFoundError):
            globex.rollback(cp)


def test_a_vector_of_text_that_redaction_changed_is_not_stored() -> None:
    """A caller's vector of the raw text encodes the secret (a search for the card number found the memory
    through it); the memory waits for the embedder instead, which embeds what is stored."""
    with redacting() as h:
        raw = [1.0] + [0.0] * 383
        secret = h.record(f"card {CARD} on file", embedding=raw, session_id="s")
        clean = h.record("nothing secret here", embedding=raw, session_id="s")
        assert CARD not in secret.content
        waiting = [memory_id for memory_id, _ in h.store.unembedded(10)]
        assert waiting == [secret.id] and clean.id not in waiting


def test_the_embedder_is_woken_for_a_memory_whose_given_vector_was_dropped(
    embedder: clawvm.MiniLMEmbedder,
) -> None:
    """It was woken only for records given no vector: the memory waited for the next flush()."""
    with Harness.open("memory://", embedder=embedder, redaction=RedactionPolicy()) as h:
        secret = h.record(f"card {CARD} on file", embedding=[1.0] + [0.0] * 383, session_id="s")
        deadline = time.monotonic() + 30  # no flush(): the worker alone embeds it
        while h.store.unembedded(1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert h.store.unembedded(1) == [] and secret.id in h.store.vectors_of([secret.id])


def test_a_langgraph_put_sends_no_secret_to_the_embedding_model() -> None:
    from clawvm.integrations.langgraph import ClawVMStore

    seen: list[str] = []

    def recording(texts: list[str]) -> list[list[float]]:
        seen.extend(texts)
        return [[1.0] + [0.0] * 383 for _ in texts]

    with redacting() as h:
        store = ClawVMStore(h, index={"dims": 384, "embed": recording, "fields": ["text"]})
        store.put(("n",), "k", {"text": f"pay with {CARD}"})
        assert seen and not any(CARD in t for t in seen)
        (item,) = h.list(limit=5)
        assert CARD not in item.content
        assert item.id in h.store.vectors_of([item.id])  # the vector of the scrubbed text is kept
        assert [hit.key for hit in store.search(("n",), query="pay with")] == ["k"]


def test_a_tag_filter_is_stripped_as_stored_tags_are() -> None:
    """record(tags=[" urgent "]) stored "urgent", and list(tags=[" urgent "]) found nothing."""
    with Harness.open("memory://", embedder=None) as h:
        m = h.record("page the on-call", tags=[" urgent "])
        assert m.tags == ["urgent"]
        assert [x.id for x in h.list(tags=[" urgent "])] == [m.id]
        assert [x.id for x in h.list(tags_any=["urgent ", "other"])] == [m.id]
        with pytest.raises(ValidationError) as exc:
            h.list(tags=["  "])
        assert exc.value.field == "tags"


def test_inputs_of_the_wrong_type_are_refused_naming_their_field() -> None:
    """Each failed with Python's own error (AttributeError, TypeError) or, for NaN, named another field."""
    from clawvm import PagerConfig, replay

    with Harness.open("memory://", embedder=None) as h:
        cases = [
            ("args", lambda: h.tool_call("sh", "notadict", session_id="x")),  # type: ignore[arg-type]
            ("agent_id", lambda: h.guidance(None, "x", 100)),  # type: ignore[arg-type]
            ("agent_id", lambda: h.guidance("  ", "x", 100)),
            ("working_items", lambda: replay.variant(h.pager.config, working_items="3")),  # type: ignore[arg-type]
            ("working_high", lambda: PagerConfig(working_high=float("nan"))),
        ]
        for field, call in cases:
            with pytest.raises(ValidationError) as exc:
                call()
            assert exc.value.field == field


#: what an engine writes with; none of it may be reachable through ``Harness.store``
_ENGINE_WRITES = (
    "put",
    "put_many",
    "write",
    "remove",
    "delete",
    "delete_many",
    "set_vectors",
    "append_event",
    "append_events",
    "import_events",
    "delete_events_upto",
    "put_credential",
    "close",
)


def test_the_store_a_harness_hands_out_only_reads(tmp_path: Path) -> None:
    """A caller holding a harness reads through ``h.store``; a write around the commit path (no
    redaction, no version check, no event) is not there to make."""
    with Harness.open(tmp_path / "h.db", embedder=None, redaction=RedactionPolicy()) as h:
        m = h.record(f"card {CARD}", session_id="s")
        plain = h.record("the cutover is on Friday", session_id="s", embedding=[1.0] + [0.0] * 383)
        view = h.store
        assert view is h.store  # one view per harness (callers may key caches by it)
        for name in _ENGINE_WRITES:
            assert hasattr(engine_of(h), name) and not hasattr(view, name), name
        assert view.get(m.id).content == h.get(m.id).content and CARD not in view.get(m.id).content
        assert view.count(Filters()) == 2 and [x.id for x in view.iter_all(Filters())] == [m.id, plain.id]
        assert view.dim == 384 and list(view.vectors_of([m.id, plain.id])) == [plain.id]
        assert [u.id for u in view.unembedded(5)] == [m.id]  # no embedder here
        assert [e.kind for e in view.read_events(0, 10, m.id)] == ["add"]


def test_late_vectors_go_through_the_commit_path_and_stop_at_close(tmp_path: Path) -> None:
    """The embedding worker's vectors are attached by the commit path: where the memory still holds the
    text they were computed from, and not once the harness closed."""
    h = Harness.open(tmp_path / "h.db", embedder=None)
    m = h.record("the deploy key rotates on Fridays", session_id="s")
    v = np.zeros((1, 384), dtype=np.float32)
    v[0, 0] = 1.0
    h.writer.attach_vectors([m.id], v, ["an older text"])  # the worker embedded what is no longer stored
    assert h.store.vectors_of([m.id]) == {}
    h.writer.attach_vectors([m.id], v, [m.content])
    assert m.id in h.store.vectors_of([m.id])
    h.close()
    with pytest.raises(clawvm.StateConflictError):
        h.writer.attach_vectors([m.id], v)


def test_a_parent_is_a_stored_memory_and_never_a_descendant() -> None:
    """A dangling, self or circular parent was stored, and a cycle hid its memories from the run trace."""
    with Harness.open("memory://", embedder=None) as h:
        a = h.record("plan the cutover", session_id="s")
        b = h.record("check the replicas", session_id="s", parent_id=a.id)
        c = h.record("replicas in sync", session_id="s", parent_id=b.id)
        for bad in (
            lambda: h.record("orphan", session_id="s", parent_id="01a2b3c4-0000-7000-8000-000000000001"),
            lambda: h.update(a.id, parent_id=a.id),
            lambda: h.update(a.id, parent_id=c.id),  # a -> c -> b -> a
        ):
            with pytest.raises(ValidationError) as refused:
                bad()
            assert refused.value.field == "parent_id"
        assert h.get(a.id).parent_id is None and h.get(a.id).version == 1
        d = h.record("an aside", session_id="s")
        assert h.update(c.id, parent_id=d.id).parent_id == d.id  # a move that makes no cycle is fine
        acme = Harness.open(engine_of(h), embedder=None, tenant="acme")  # a tenant's view of one store
        with pytest.raises(ValidationError):  # another tenant's memory is no parent of this one's
            acme.record("mine", parent_id=a.id)
        theirs = acme.record("acme's own step")
        with pytest.raises(ValidationError):  # nor for the owner's view, which reads every tenant's
            h.record("the default tenant's", parent_id=theirs.id)


def test_a_trace_shows_every_step_of_a_store_holding_a_parent_cycle() -> None:
    from clawvm.dashboard import debug
    from clawvm.dashboard.routes import lens_for

    with Harness.open("memory://", embedder=None) as h:
        a = h.record("plan the cutover", session_id="s")
        b = h.record("check the replicas", session_id="s", parent_id=a.id)
        c = h.record("replicas in sync", session_id="s")
        # as an older version stored them: a memory its own parent, and a and b each other's
        engine_of(h).put(h.get(a.id).model_copy(update={"parent_id": b.id, "version": 2}))
        engine_of(h).put(h.get(c.id).model_copy(update={"parent_id": c.id, "version": 2}))
        traced = debug.trace(lens_for(h), "s")

        def ids(steps: list[dict[str, object]]) -> list[object]:
            return [x for s in steps for x in (s["id"], *ids(s["children"]))]  # type: ignore[arg-type]

        assert traced["unfiltered"] == 3 and sorted(ids(traced["steps"])) == sorted([a.id, b.id, c.id])
