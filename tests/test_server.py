"""The REST server: every SDK operation over HTTP, one error schema, limits, logs, and bad input.

Everything runs against the real app over a real SQLite store in ``tmp_path``: one test over uvicorn on
a loopback port, the rest through Starlette's TestClient; schemathesis fuzzes every operation of the
OpenAPI spec (bounded) for 5xx and for 4xx outside the error schema.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import io
import json
import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from clawvm import Harness, Memory
from clawvm.core.errors import ConfigError, NotFoundError, RateLimitError, ValidationError
from clawvm.core.redact import RedactionPolicy
from clawvm.server import (
    JsonFormatter,
    RateLimiter,
    ServerSettings,
    Writer,
    create_app,
    redaction_options,
)
from clawvm.server.middleware import JSON_INLINE_BYTES, Guard
from clawvm.server.service import RequestGauge
from clawvm.store import SQLiteStore, Store
from clawvm.store.crypto import KEY_ENV, KEY_FILE_ENV, DataKey
from clawvm.teams.shared import can_write
from clawvm.vm.compress import SummarizerError
from loopback import serve_app

ERROR_KEYS = {"code", "message", "field", "fix"}


@dataclass
class Env:
    client: TestClient
    store: Store
    keys: dict[str, str]

    def auth(self, who: str = "agent") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def record(
        self, content: Any = "the deploy failed: disk full on build-07", who: str = "agent", **fields: Any
    ) -> dict[str, Any]:
        r = self.client.post("/v1/memories", json={"content": content, **fields}, headers=self.auth(who))
        assert r.status_code == 201, r.text
        body: dict[str, Any] = r.json()
        return body


def open_app(
    tmp_path: Path, settings: ServerSettings | None = None, routers: tuple[APIRouter, ...] = ()
) -> tuple[Any, Store, dict[str, str]]:
    store = SQLiteStore(tmp_path / "server.db")
    app = create_app(store, embedder=None, settings=settings or ServerSettings(rate_per_s=0), routers=routers)
    ring = app.state.service.keyring
    keys = {
        "admin": ring.create("acme", "admin", "ops")[1],
        "agent": ring.create("acme", "agent", "bot")[1],
        "reader": ring.create("acme", "read-only", "viewer")[1],
        "other": ring.create("globex", "agent", "their bot")[1],
    }
    return app, store, keys


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    app, store, keys = open_app(tmp_path)
    with TestClient(app) as client:
        yield Env(client, store, keys)
    store.close()


def checksum(store: Store) -> str:
    """Every memory (all tenants) and the length of the event log."""
    text = "\n".join(sorted(m.to_json() for m in store.iter_all()))
    return hashlib.sha256(f"{text}|{len(store.read_events(0, 10**9))}".encode()).hexdigest()


def assert_error(
    r: httpx.Response, status: int, code: str | None = None, field: str | None = None
) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    err: dict[str, Any] = body["error"]
    assert isinstance(err["code"], str) and isinstance(err["message"], str) and err["message"]
    assert err["field"] is None or isinstance(err["field"], str)
    assert err["fix"] is None or isinstance(err["fix"], str)
    if code is not None:
        assert err["code"] == code, err
    if field is not None:
        assert err["field"] == field, err
    return err


# ---- the SDK over HTTP --------------------------------------------------------------------------------
def test_a_query_parameter_the_route_does_not_take_is_refused(env: Env) -> None:
    """A misspelt filter was ignored: ``?sesion_id=s1`` listed every memory, as if no filter were asked."""
    env.record(session_id="s1")
    env.record(session_id="s2")
    typo = env.client.get("/v1/memories", params={"sesion_id": "s1"}, headers=env.auth())
    assert "session_id" in assert_error(typo, 422, "validation_error", "sesion_id")["fix"]
    lens = env.client.get("/dashboard/api/memories", params={"sesion": "s1"}, headers=env.auth())
    assert_error(lens, 422, "validation_error", "sesion")
    listed = env.client.get("/v1/memories", params={"session_id": "s1"}, headers=env.auth())
    assert listed.status_code == 200 and len(listed.json()) == 1


def test_a_valid_json_body_python_cannot_read_says_why(env: Env) -> None:
    """JSON nested thousands deep, or an integer of thousands of digits, was "There was an error parsing
    the body", fix "send a JSON body", though the body was JSON."""
    huge = b'{"content": "x", "metadata": {"n": ' + b"9" * 5000 + b"}}"
    for body, words in ((DEEP, "deeper"), (huge, "digits")):
        r = env.client.post(
            "/v1/memories", content=body, headers={**env.auth(), "Content-Type": "application/json"}
        )
        err = assert_error(r, 400, "bad_request", "body")
        assert words in err["message"] and "JSON body" not in err["fix"]


def test_a_query_parameter_given_twice_or_not_utf8_is_refused(env: Env) -> None:
    """``?limit=1&limit=3`` read the last and ignored the first; ``?session_id=%FF`` was decoded with a
    replacement character and answered 200 [] (a path's bytes were already refused)."""
    for i in range(3):
        env.record(session_id="s1", tags=[f"t{i}"])
    twice = env.client.get("/v1/memories?limit=1&limit=3", headers=env.auth())
    assert "once" in assert_error(twice, 422, "validation_error", "limit")["fix"]
    # a list filter takes a value each time it is given
    both = env.client.get("/v1/memories?tags_any=t0&tags_any=t1", headers=env.auth())
    assert both.status_code == 200 and len(both.json()) == 2
    for query, field in (("session_id=%FF", "session_id"), ("session_id=s1&%FF=x", "query")):
        assert_error(env.client.get(f"/v1/memories?{query}", headers=env.auth()), 400, "invalid_utf8", field)
    spaced = env.client.get("/v1/memories?session_id=s%C3%A9+1", headers=env.auth())  # UTF-8 and a +
    assert spaced.status_code == 200 and spaced.json() == []


class _RacedAfterRead(SQLiteStore):
    """A SQLite store that runs ``race`` once, right after its next read of memories once armed: what
    another process writes between a request's read and its write."""

    race: Any = None

    def get_many(self, ids: Any) -> dict[str, Memory]:
        found = super().get_many(ids)
        race, self.race = self.race, None
        if race is not None:
            race()
        return found


def test_a_patch_without_expected_version_that_loses_a_race_names_the_memory(tmp_path: Path) -> None:
    """Another process's change landing between a PATCH's read and its write was a 409 naming
    expected_version ("is at version 2, not 1"), which the body did not hold: it names the memory, says it
    changed meanwhile, and that a retry (or an expected_version) is the way on."""
    store = _RacedAfterRead(tmp_path / "server.db")
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0))
    key = app.state.service.keyring.create("acme", "agent", "bot")[1]
    auth = {"Authorization": f"Bearer {key}"}
    other = Harness.open(tmp_path / "server.db", embedder=None, tenant="acme")  # another process's
    with TestClient(app) as client, other:
        m = client.post("/v1/memories", json={"content": "the deploy failed"}, headers=auth).json()
        store.race = lambda: other.update(m["id"], tags=["theirs"])
        lost = client.patch(f"/v1/memories/{m['id']}", json={"state": "success"}, headers=auth)
        err = assert_error(lost, 409, "conflict", "memory_id")
        assert "changed while this update was being written" in err["message"]
        assert "retry the update" in err["fix"] and "expected_version" in err["fix"]
        again = client.patch(f"/v1/memories/{m['id']}", json={"state": "success"}, headers=auth)
        assert again.status_code == 200 and again.json()["tags"] == ["theirs"]
    store.close()


def test_memory_crud_with_versions(env: Env) -> None:
    m = env.record(tags=["ci"], session_id="s1", kind="error", state="error")
    assert m["tenant"] == "acme" and m["version"] == 1 and m["tier"] == "working"
    got = env.client.get(f"/v1/memories/{m['id']}", headers=env.auth("reader")).json()
    assert got == m
    r = env.client.patch(
        f"/v1/memories/{m['id']}", json={"expected_version": 1, "state": "success"}, headers=env.auth()
    )
    assert r.status_code == 200 and r.json()["version"] == 2 and r.json()["state"] == "success"
    stale = env.client.patch(
        f"/v1/memories/{m['id']}", json={"expected_version": 1, "state": "error"}, headers=env.auth()
    )
    assert_error(stale, 409, "conflict", "expected_version")
    for nulls in ({"kind": None}, {"content": None}, {"content": None, "tags": None}):
        unchanged = env.client.patch(f"/v1/memories/{m['id']}", json=nulls, headers=env.auth())
        assert unchanged.status_code == 200 and unchanged.json() == r.json()  # no change: no new version
    stale_noop = {"expected_version": 1}
    assert_error(env.client.patch(f"/v1/memories/{m['id']}", json=stale_noop, headers=env.auth()), 409)
    for owned, route in (("value", "/feedback"), ("pinned", "/pin")):  # the route that changes it, named
        refused = env.client.patch(f"/v1/memories/{m['id']}", json={owned: 1}, headers=env.auth())
        assert route in assert_error(refused, 422, "validation_error", owned)["fix"]
    listed = env.client.get("/v1/memories", params={"tags": ["ci"], "kind": ["error"]}, headers=env.auth())
    assert [x["id"] for x in listed.json()] == [m["id"]]
    assert env.client.get("/v1/memories", params={"kind": ["note"]}, headers=env.auth()).json() == []
    # status "any", as the SDK takes it (it was a 422 offering 'internal', which the SDK refuses)
    archived = env.client.patch(f"/v1/memories/{m['id']}", json={"status": "archived"}, headers=env.auth())
    assert archived.status_code == 200
    assert env.client.get("/v1/memories", headers=env.auth()).json() == []
    for status in (["any"], ["active", "any"], ["archived"]):
        found = env.client.get("/v1/memories", params={"status": status}, headers=env.auth()).json()
        assert [x["id"] for x in found] == [m["id"]], status
    recalled = env.client.post(
        "/v1/recall", json={"query": "disk", "filters": {"status": ["any"]}}, headers=env.auth()
    )
    assert recalled.status_code == 200, recalled.text
    refused = env.client.get("/v1/memories", params={"status": ["internal"]}, headers=env.auth())
    assert_error(refused, 422, field="status.0")
    assert "internal" not in refused.text.replace("status.0", "")
    stale = env.client.delete(f"/v1/memories/{m['id']}", params={"expected_version": 1}, headers=env.auth())
    assert_error(stale, 409, "conflict", "expected_version")  # archived since version 1: kept
    version = env.client.get(f"/v1/memories/{m['id']}", headers=env.auth()).json()["version"]
    deleted = env.client.delete(
        f"/v1/memories/{m['id']}", params={"expected_version": version}, headers=env.auth()
    )
    assert deleted.status_code == 204
    assert_error(env.client.get(f"/v1/memories/{m['id']}", headers=env.auth()), 404, "not_found", "memory_id")


def test_json_content_is_stored_canonically(env: Env) -> None:
    m = env.record({"b": 1, "a": [1, 2]}, kind="tool_call")
    assert m["content"] == '{"a":[1,2],"b":1}' and m["content_type"] == "application/json"


def test_recall_and_context_explain_their_evidence(env: Env) -> None:
    disk = env.record("The deploy failed because the disk on build-07 was full", session_id="s1")
    env.record("Lunch order: two pizzas and a salad", session_id="s1")
    hits = env.client.post(
        "/v1/recall", json={"query": "why did the deploy fail", "k": 2}, headers=env.auth()
    ).json()
    assert hits[0]["id"] == disk["id"] and "lexical" in hits[0]["explain"]
    # tracked by default for an agent: the background pager writes the access soon after the answer
    deadline = time.monotonic() + 10
    while (stored := env.client.get(f"/v1/memories/{disk['id']}", headers=env.auth()).json())[
        "access_count"
    ] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stored["access_count"] == 1 and stored["version"] == 2 and stored["changed_version"] == 1
    # that bookkeeping is no change to the caller who read version 1
    patched = env.client.patch(
        f"/v1/memories/{disk['id']}", json={"expected_version": 1, "state": "success"}, headers=env.auth()
    )
    assert patched.status_code == 200 and patched.json()["version"] == 3
    ctx = env.client.post(
        "/v1/context",
        json={"query": "deploy disk", "budget_tokens": 200, "session_id": "s1"},
        headers=env.auth(),
    ).json()
    assert disk["id"] in [e["id"] for e in ctx["manifest"]] and ctx["tokens"] <= 200
    assert "disk on build-07" in ctx["text"]


def test_read_only_keys_read_without_side_effects(env: Env) -> None:
    m = env.record()
    hits = env.client.post("/v1/recall", json={"query": "deploy disk"}, headers=env.auth("reader")).json()
    assert hits[0]["memory"]["access_count"] == 0  # not tracked for read-only keys
    assert_error(
        env.client.post("/v1/recall", json={"query": "x", "track": True}, headers=env.auth("reader")),
        403,
        "forbidden",
        "role",
    )
    ctx = env.client.post("/v1/context", json={"query": "deploy"}, headers=env.auth("reader"))
    assert ctx.status_code == 200
    assert env.client.get(f"/v1/memories/{m['id']}", headers=env.auth()).json()["usage"]["injected"] == 0
    for method, path, body in [
        ("POST", "/v1/memories", {"content": "x"}),
        ("PATCH", f"/v1/memories/{m['id']}", {"state": "error"}),
        ("DELETE", f"/v1/memories/{m['id']}", None),
        ("POST", f"/v1/memories/{m['id']}/pin", None),
        ("POST", "/v1/tick", None),
        ("GET", "/v1/keys", None),
    ]:
        r = env.client.request(method, path, json=body, headers=env.auth("reader"))
        assert_error(r, 403, "forbidden", "role")


def test_a_read_only_context_build_writes_nothing_and_a_writers_logs_one_event(env: Env) -> None:
    env.record("the deploy failed: disk full on build-07", session_id="s1")
    env.record("the deploy plan for build 8", session_id="s1", pinned=True)
    before = checksum(env.store)
    for body in ({"query": "deploy disk"}, {"query": "deploy", "session_id": "s1", "budget_tokens": 300}):
        r = env.client.post("/v1/context", json=body, headers=env.auth("reader"))
        assert r.status_code == 200 and r.json()["manifest"] and r.json()["event_seq"] is None, r.text
    assert checksum(env.store) == before  # no context event, no usage, no pager pass
    events = len(env.store.read_events(0, 1000))
    r = env.client.post("/v1/context", json={"query": "deploy disk"}, headers=env.auth())
    assert r.json()["event_seq"] is not None and len(env.store.read_events(0, 1000)) == events + 1


def test_a_retry_with_the_same_idempotency_key_returns_the_first_response_and_writes_nothing(
    env: Env,
) -> None:
    once = {**env.auth(), "Idempotency-Key": "9f1c2d3e-retry-1"}
    body = {"content": "the deploy failed: disk full on build-07", "tags": ["ci"]}
    first = env.client.post("/v1/memories", json=body, headers=once)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    before = checksum(env.store)
    again = env.client.post("/v1/memories", json=body, headers=once)
    assert again.status_code == 201 and again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert checksum(env.store) == before  # no second memory, no event
    changed = env.client.post("/v1/memories", json={**body, "tags": ["cd"]}, headers=once)
    err = assert_error(changed, 409, "idempotency_key_reused", "Idempotency-Key")
    assert err["fix"] and checksum(env.store) == before
    # keys are per tenant: another tenant's request with the same key is its own
    theirs = env.client.post(
        "/v1/memories", json=body, headers={**env.auth("other"), "Idempotency-Key": "9f1c2d3e-retry-1"}
    )
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    # a first attempt that failed wrote nothing and is not kept: the retry runs
    fixed = {**env.auth(), "Idempotency-Key": "retry-after-a-422"}
    spaced = {**env.auth(), "Idempotency-Key": "two words"}
    spaced_key = env.client.post("/v1/memories", json=body, headers=spaced)
    err = assert_error(spaced_key, 422, field="Idempotency-Key")
    assert "visible ASCII" in err["fix"] and "x21" not in err["message"]  # words, not the regex
    assert_error(env.client.post("/v1/memories", json={"content": " "}, headers=fixed), 422, field="content")
    # a blank scope id is refused (stored as none, it was not the session a read of "  " then asked for)
    blank = env.client.post("/v1/memories", json={"content": "x", "session_id": "  "}, headers=env.auth())
    assert_error(blank, 422, field="session_id")
    # in words, not the regex: "String should match pattern '[^\\u0009\\u000a...'"
    unnamed = env.client.post("/v1/sessions/s1/checkpoints", json={"name": "   "}, headers=env.auth())
    assert_error(unnamed, 422, field="name")
    assert unnamed.json()["error"]["message"] == "is blank or holds a control character"
    assert "\\u" not in unnamed.text
    for name in ("a\nb", "N" * 201):  # the SDK's rule (clawvm.vm.checkpoint.checked_name)
        refused = env.client.post("/v1/sessions/s1/checkpoints", json={"name": name}, headers=env.auth())
        assert_error(refused, 422, field="name")
    assert env.client.post("/v1/memories", json=body, headers=fixed).status_code == 201
    # checkpoints too
    take = {**env.auth(), "Idempotency-Key": "cp-1"}
    cp = env.client.post("/v1/sessions/s1/checkpoints", json={"name": "before"}, headers=take)
    before = checksum(env.store)
    assert (
        env.client.post("/v1/sessions/s1/checkpoints", json={"name": "before"}, headers=take).json()
        == cp.json()
    )
    assert checksum(env.store) == before
    other_session = env.client.post("/v1/sessions/s2/checkpoints", json={"name": "before"}, headers=take)
    assert_error(other_session, 409, "idempotency_key_reused", "Idempotency-Key")
    for bad in ("", "has space", "k" * 256):
        r = env.client.post("/v1/memories", json=body, headers={**env.auth(), "Idempotency-Key": bad})
        assert_error(r, 422, "validation_error", "Idempotency-Key")


def test_a_retry_that_reaches_another_worker_finds_the_memory_instead_of_writing_it_twice(
    tmp_path: Path,
) -> None:
    """Two server processes on one store keep their own idempotency keys (as ``serve --workers`` runs them,
    and as a restart leaves one): the keyed id is what they share."""
    app, store, keys = open_app(tmp_path)
    other = create_app(
        SQLiteStore(tmp_path / "server.db"), embedder=None, settings=ServerSettings(rate_per_s=0)
    )
    body = {"content": "the deploy failed: disk full on build-07", "session_id": "s1"}
    headers = {"Authorization": f"Bearer {keys['agent']}", "Idempotency-Key": "retry-elsewhere"}
    with TestClient(app) as first_worker, TestClient(other) as second_worker:
        first = first_worker.post("/v1/memories", json=body, headers=headers)
        assert first.status_code == 201, first.text
        events = len(store.read_events(limit=1000))
        again = second_worker.post("/v1/memories", json=body, headers=headers)
        assert again.status_code == 201, again.text
        assert again.json()["id"] == first.json()["id"]
        # a replay like any other (it said nothing: the client could not tell it from a first write)
        assert again.headers["Idempotent-Replayed"] == "true"
        kept = second_worker.post("/v1/memories", json=body, headers=headers)  # now kept by this worker
        assert kept.headers["Idempotent-Replayed"] == "true" and kept.content == again.content
        assert store.count() == 1 and len(store.read_events(limit=1000)) == events
        # the retry taught the second worker the key's body: another body under it is a 409 there too
        changed = second_worker.post("/v1/memories", json={**body, "content": "disk fine"}, headers=headers)
        assert_error(changed, 409, "idempotency_key_reused", "Idempotency-Key")
        assert store.count() == 1
    store.close()


def test_a_retry_after_a_restart_never_brings_back_a_memory_forgotten_since(tmp_path: Path) -> None:
    """The keyed id no longer conflicted once the memory was deleted: the retry recorded it again."""
    app, store, keys = open_app(tmp_path)
    body = {"content": "the deploy failed: disk full on build-07"}
    headers = {"Authorization": f"Bearer {keys['agent']}", "Idempotency-Key": "made-then-forgotten"}
    with TestClient(app) as before:
        made = before.post("/v1/memories", json=body, headers=headers).json()
        assert before.delete(f"/v1/memories/{made['id']}", headers=headers).status_code == 204
    restarted = create_app(
        SQLiteStore(tmp_path / "server.db"), embedder=None, settings=ServerSettings(rate_per_s=0)
    )
    with TestClient(restarted) as after:
        again = after.post("/v1/memories", json=body, headers=headers)
        assert_error(again, 409, field="Idempotency-Key")
        assert store.count() == 0
        fresh = after.post("/v1/memories", json=body, headers={**headers, "Idempotency-Key": "another"})
        assert fresh.status_code == 201
    store.close()


def test_idempotency_keys_are_bounded_and_expire(tmp_path: Path) -> None:
    # a lifetime that two back-to-back posts on a loaded CI machine cannot outlast
    settings = ServerSettings(rate_per_s=0, idempotency_max_keys=2, idempotency_ttl_s=3.0)
    app, store, keys = open_app(tmp_path, settings)
    with TestClient(app) as client:

        def post(key: str) -> str:
            r = client.post(
                "/v1/memories",
                json={"content": "a note"},
                headers={"Authorization": f"Bearer {keys['agent']}", "Idempotency-Key": key},
            )
            assert r.status_code == 201, r.text
            memory_id: str = r.json()["id"]
            return memory_id

        first = post("k1")
        assert post("k1") == first
        post("k2")
        post("k3")  # over 2 keys: k1, the oldest, is gone from this process's keys
        count = store.count()
        assert post("k1") == first  # ... but its memory is found under its keyed id: not written twice
        assert store.count() == count
        assert len(app.state.service.idempotency) == 2
        kept = post("k4")
        assert post("k4") == kept
        time.sleep(3.1)  # past the key's lifetime: the retry runs again and finds the memory it recorded
        assert post("k4") == kept and store.count() == count + 1
        # while the first request with a key runs, a second one with that key is a 409
        running = app.state.service.idempotency
        assert running.begin("acme", "k5", "fingerprint") is None
        busy = running.begin("acme", "k5", "fingerprint")
        assert busy is not None and busy.status_code == 409
        assert json.loads(busy.body)["error"]["field"] == "Idempotency-Key"
    store.close()


def test_pin_feedback_value_compress_and_events(env: Env) -> None:
    text = " ".join(f"We talked about the {w} and the long queue at the coffee shop." for w in "abcdefghij")
    m = env.record(text, session_id="s1")
    assert env.client.post(f"/v1/memories/{m['id']}/pin", headers=env.auth()).json()["pinned"] is True
    assert env.client.post(f"/v1/memories/{m['id']}/unpin", headers=env.auth()).json()["pinned"] is False
    rated = env.client.post(f"/v1/memories/{m['id']}/feedback", json={"delta": -1}, headers=env.auth()).json()
    assert rated["usage"]["feedback"] == -1
    assert_error(
        env.client.post(f"/v1/memories/{m['id']}/feedback", json={"delta": 2}, headers=env.auth()),
        422,
        field="delta",
    )
    value = env.client.get(f"/v1/memories/{m['id']}/value", headers=env.auth()).json()
    assert 0 <= value["value"] <= 1 and value["feedback"] < 0.5
    small = env.client.post(f"/v1/memories/{m['id']}/compress", headers=env.auth()).json()
    assert len(small["content"]) < len(text) and "compression" in small["metadata"]
    assert env.client.post(f"/v1/memories/{m['id']}/decompress", headers=env.auth()).json()["content"] == text
    page = env.client.get("/v1/events", params={"limit": 2}, headers=env.auth()).json()
    assert [e["kind"] for e in page["events"]] == ["add", "pin"]
    rest = env.client.get(
        "/v1/events", params={"after_seq": page["next_after_seq"]}, headers=env.auth()
    ).json()
    assert {"feedback", "compress"} <= {e["kind"] for e in rest["events"]}
    assert all(e["tenant"] == "acme" for e in page["events"] + rest["events"])


def test_a_session_or_task_id_holding_a_slash_is_reachable(env: Env) -> None:
    """Record took "team/a", but every session route was a 404 for it, the slash encoded or not."""
    made = env.client.post(
        "/v1/memories", json={"content": "x", "session_id": "team/a", "task_id": "t/1"}, headers=env.auth()
    )
    assert made.status_code == 201
    taken = env.client.post("/v1/sessions/team%2Fa/checkpoints", json={"name": "cp"}, headers=env.auth())
    assert taken.status_code == 201, taken.text
    listed = env.client.get("/v1/sessions/team/a/checkpoints", headers=env.auth()).json()
    assert [c["name"] for c in listed] == ["cp"]
    assert env.client.post("/v1/tasks/t%2F1/collapse", headers=env.auth()).status_code == 200


def test_allow_names_the_methods_the_router_takes_at_the_path(env: Env) -> None:
    """``Allow`` was read from the OpenAPI templates split on ``/``: a trailing slash answered 204 with the
    memory routes' methods (GET there is a redirect), and a session id holding a slash a 405 naming POST
    only (GET there is a 200)."""
    slash = env.client.options("/v1/memories/", follow_redirects=False)
    assert (slash.status_code, slash.headers.get("location")) == (307, "http://testserver/v1/memories")
    for path in ("/v1/sessions/team/a/checkpoints", "/v1/sessions/a/checkpoints"):
        r = env.client.options(path)
        assert (r.status_code, r.headers["allow"]) == (204, "GET, OPTIONS, POST"), (path, r.text)
        put = env.client.put(path, headers=env.auth())
        assert_error(put, 405, "method_not_allowed")
        assert put.headers["allow"] == "GET, OPTIONS, POST"
    assert env.client.options("/v1/nothing").status_code == 404


def test_a_mounted_app_answers_allow_and_names_path_parameters_under_its_prefix(tmp_path: Path) -> None:
    """Mounted under a prefix (or run with a root_path), the templates were matched against the full path:
    ``OPTIONS /clawvm/v1/keys`` was a 405 naming GET only, and a bad byte in a memory id named ``path``."""
    app, store, keys = open_app(tmp_path)
    outer = FastAPI()
    outer.mount("/clawvm", app)
    admin = {"Authorization": f"Bearer {keys['admin']}"}
    with TestClient(outer) as client:
        r = client.options("/clawvm/v1/keys")
        assert (r.status_code, r.headers["allow"]) == (204, "GET, OPTIONS, POST"), r.text
        put = client.put("/clawvm/v1/keys", headers=admin)
        assert_error(put, 405, "method_not_allowed")
        assert put.headers["allow"] == "GET, OPTIONS, POST"
        assert client.get("/clawvm/v1/keys", headers=admin).status_code == 200
        assert_error(client.get("/clawvm/v1/memories/%FF", headers=admin), 400, "invalid_utf8", "memory_id")
        bad = client.get("/clawvm/v1/sessions/team/a%FF/checkpoints", headers=admin)
        assert_error(bad, 400, "invalid_utf8", "session_id")
    store.close()


def test_a_body_sent_to_a_route_that_takes_none_is_refused(env: Env) -> None:
    """DELETE ignored {"expected_version": 99} and deleted whatever the version."""
    m = env.client.post("/v1/memories", json={"content": "keep me"}, headers=env.auth()).json()
    sent = env.client.request(
        "DELETE", f"/v1/memories/{m['id']}", json={"expected_version": 99}, headers=env.auth()
    )
    err = assert_error(sent, 422, field="body")
    assert "expected_version" in (err["fix"] or "")
    assert env.client.get(f"/v1/memories/{m['id']}", headers=env.auth()).status_code == 200
    assert (
        env.client.post("/v1/tick", json={}, headers=env.auth()).status_code == 200
    )  # an empty object is none


def test_a_list_pages_by_cursor_without_repeating_or_skipping(env: Env) -> None:
    """Paging by created_before skipped memories made at one instant (an import's): 5 of 12 were seen."""
    at = "2026-01-01T00:00:00Z"
    made = [{"content": f"tie {i}", "session_id": "tie", "created_at": at} for i in range(12)]
    assert env.client.post(
        "/v1/memories/import", json={"memories": made}, headers=env.auth("admin")
    ).is_success
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        after = {"after": cursor} if cursor else {}
        page = env.client.get(
            "/v1/memories", params={"session_id": "tie", "limit": 5, **after}, headers=env.auth()
        )
        assert page.status_code == 200, page.text
        seen += page.json()
        cursor = page.headers.get("X-Next-Cursor")
        # written between pages: newer than every page's position, so never in a later page; and the
        # page's last memory forgotten: its position still pages on
        env.client.post(
            "/v1/memories", json={"content": "a later one", "session_id": "tie"}, headers=env.auth()
        )
        if cursor is None:
            break
        env.client.delete(f"/v1/memories/{seen[-1]['id']}", headers=env.auth())
    assert sorted(m["content"] for m in seen) == sorted(m["content"] for m in made)
    for bad in ("x", "12~nope", "01a00000-0000-7000-8000-000000000000"):
        err = assert_error(
            env.client.get("/v1/memories", params={"after": bad}, headers=env.auth()), 422, field="after"
        )
        assert "X-Next-Cursor" in err["fix"] and "[0-9]" not in err["message"]  # words, not the regex
    far = "-99999999999999999~01a00000-0000-7000-8000-000000000000"  # before the calendar: an empty page
    assert env.client.get("/v1/memories", params={"after": far}, headers=env.auth()).json() == []


def test_checkpoint_rollback_session_start_collapse_tick(env: Env) -> None:
    kept = env.record("deploy plan: roll out build 7", session_id="s1", task_id="t1", state="intermediate")
    cp = env.client.post("/v1/sessions/s1/checkpoints", json={"name": "before"}, headers=env.auth())
    assert cp.status_code == 201
    later = env.record("an experiment we will undo", session_id="s1")
    listed = env.client.get("/v1/sessions/s1/checkpoints", headers=env.auth("reader"))
    assert [(c["id"], c["name"], c["memories"]) for c in listed.json()] == [(cp.json()["id"], "before", 1)]
    assert env.client.get("/v1/sessions/s9/checkpoints", headers=env.auth()).json() == []
    report = env.client.post(f"/v1/checkpoints/{cp.json()['id']}/rollback", headers=env.auth()).json()
    assert report["obsoleted"] == [later["id"]]
    assert_error(
        env.client.post(f"/v1/checkpoints/{kept['id']}/rollback", headers=env.auth()),
        422,
        field="checkpoint_id",
    )
    loaded = env.client.post("/v1/sessions/s2/start", json={"task": "roll out build 7"}, headers=env.auth())
    assert loaded.status_code == 200
    summary = env.client.post("/v1/tasks/t1/collapse", headers=env.auth()).json()["summary"]
    assert summary["kind"] == "summary" and kept["id"] in [link["target"] for link in summary["links"]]
    assert env.client.post("/v1/tasks/none/collapse", headers=env.auth()).json() == {"summary": None}
    assert set(env.client.post("/v1/tick", headers=env.auth()).json()) == {"expired", "refreshed", "moved"}
    stats = env.client.get("/v1/stats", headers=env.auth()).json()
    assert stats["memories"] == sum(stats["by_status"].values()) and stats["by_status"]["obsolete"] == 1


def test_stats_totals_agree_while_another_process_writes(env: Env, tmp_path: Path) -> None:
    """Another process commits before each of the route's reads: counted one status and one tier at a time,
    the total and the sum by tier disagreed; they come from one read now."""
    env.record("first")
    other = SQLiteStore(tmp_path / "server.db")  # what another process writing to the file is
    other.setup()

    def committed_first(read: Any) -> Any:
        def then_read(*args: Any, **kwargs: Any) -> Any:
            other.put(Memory(content="meanwhile", tenant="acme", tier="long_term"))
            return read(*args, **kwargs)

        return then_read

    try:
        for name in ("count", "group_counts"):  # each read the engine has
            if hasattr(env.store, name):
                setattr(env.store, name, committed_first(getattr(env.store, name)))
        stats = env.client.get("/v1/stats", headers=env.auth()).json()
    finally:
        for name in ("count", "group_counts"):
            vars(env.store).pop(name, None)
        other.close()
    assert stats["memories"] == sum(stats["by_status"].values()) == sum(stats["by_tier"].values()), stats


#: Memories that only look like checkpoints (kind agent_state, tag checkpoint) -> their content; ``{m}`` is
#: a memory of the session, ``{s}`` the session the fake is recorded in. Each once made rollback a 500.
FAKE_CHECKPOINTS: dict[str, str] = {
    "content not JSON": "remember: roll back before the demo",
    "JSON but not an object": "[1, 2]",
    "no memories": '{"name": "x", "session_id": "{s}"}',
    "memories not an object": '{"name": "x", "session_id": "{s}", "memories": []}',
    "no session": '{"name": "x", "memories": {}}',
    "session not a string": '{"name": "x", "session_id": 5, "memories": {}}',
    "no name": '{"session_id": "{s}", "memories": {}}',
    "a line with an unknown tier": '{"name": "x", "session_id": "{s}", "memories": {"{m}": {"tier": "hot"}}}',
    "a line that is not an object": '{"name": "x", "session_id": "{s}", "memories": {"{m}": 5}}',
    "snapshot of another session": '{"name": "x", "session_id": "elsewhere", "memories": {}}',
}


def fake_checkpoint(case: str, session_id: str, member_id: str) -> str:
    return FAKE_CHECKPOINTS[case].replace("{s}", session_id).replace("{m}", member_id)


@pytest.mark.parametrize("case", list(FAKE_CHECKPOINTS))
def test_rollback_of_a_memory_that_only_looks_like_a_checkpoint_is_a_422(env: Env, case: str) -> None:
    member = env.record("deploy plan: roll out build 7", session_id="s1")
    env.record("an experiment in another session", session_id="elsewhere")
    fake = env.record(
        fake_checkpoint(case, "s1", member["id"]), session_id="s1", kind="agent_state", tags=["checkpoint"]
    )
    before = checksum(env.store)
    err = assert_error(
        env.client.post(f"/v1/checkpoints/{fake['id']}/rollback", headers=env.auth()),
        422,
        "validation_error",
        "checkpoint_id",
    )
    assert fake["id"] in err["message"] and err["fix"]
    assert checksum(env.store) == before  # nothing restored, nothing obsoleted, no event


@pytest.mark.parametrize("case", list(FAKE_CHECKPOINTS))
def test_rollback_of_a_fake_checkpoint_through_the_sdk_is_a_validation_error(
    tmp_path: Path, case: str
) -> None:
    with Harness.open(tmp_path / "sdk.db", embedder=None, tenant="acme") as h:
        member = h.record("deploy plan: roll out build 7", session_id="s1")
        h.record("an experiment in another session", session_id="elsewhere")
        content = fake_checkpoint(case, "s1", member.id)
        fake = h.record(content, session_id="s1", kind="agent_state", tags=["checkpoint"])
        before = checksum(h.store)
        with pytest.raises(ValidationError) as raised:
            h.rollback(fake.id)
        assert raised.value.field == "checkpoint_id" and fake.id in raised.value.problem
        assert checksum(h.store) == before


def test_rollback_of_another_tenants_checkpoint_changes_nothing(env: Env, tmp_path: Path) -> None:
    env.record("acme's plan", session_id="s1")
    cp = env.client.post("/v1/sessions/s1/checkpoints", json={"name": "acme"}, headers=env.auth()).json()
    env.record("acme's later step", session_id="s1")
    before = checksum(env.store)
    r = env.client.post(f"/v1/checkpoints/{cp['id']}/rollback", headers=env.auth("other"))
    assert_error(r, 404, "not_found", "checkpoint_id")
    assert checksum(env.store) == before
    # through the SDK over one shared store (no tenant view in between): refused by the rollback itself
    store = SQLiteStore(tmp_path / "shared.db")
    acme, globex = Harness(store, None, tenant="acme"), Harness(store, None, tenant="globex")
    acme.record("acme's plan", session_id="s1")
    theirs = acme.checkpoint("s1", "acme")
    later = acme.record("acme's later step", session_id="s1")
    with pytest.raises(NotFoundError):  # as if it did not exist, like over REST
        globex.rollback(theirs)
    assert store.get(later.id).status.value == "active"
    store.close()


def test_an_export_of_a_tenant_with_grants_imports_back(env: Env, tmp_path: Path) -> None:
    """Grants are internal records: the export leaves them out, so its import (which refuses internal
    records) takes the whole file."""
    Harness(env.store, None, tenant="acme").grant("crew", "alice", write=True)
    env.record(session_id="s1")
    exported = env.client.get("/v1/export", headers=env.auth("reader")).text.splitlines()
    assert exported and all(json.loads(line)["status"] != "internal" for line in exported)
    target, _, keys = open_app(tmp_path / "target")
    admin = {"Authorization": f"Bearer {keys['admin']}"}
    body = {"memories": [json.loads(line) for line in exported]}
    done = TestClient(target).post("/v1/memories/import", json=body, headers=admin)
    assert done.status_code == 200, done.text
    assert done.json() == {"imported": len(exported), "skipped": 0, "renamed": {}, "differing": []}


def test_export_and_import_stay_in_the_tenant(env: Env) -> None:
    m = env.record(session_id="s1")
    lines = env.client.get("/v1/export", headers=env.auth("reader"))
    assert lines.headers["content-type"].startswith("application/x-ndjson")
    exported = [json.loads(line) for line in lines.text.splitlines()]
    assert [e["id"] for e in exported] == [m["id"]]
    theirs = env.client.get("/v1/export", headers=env.auth("other")).text
    assert theirs == ""
    # the list's filters narrow it; an unknown one is refused (it was silently ignored: everything came)
    assert env.client.get("/v1/export", params={"session_id": "s2"}, headers=env.auth("reader")).text == ""
    assert (
        env.client.get("/v1/export", params={"session_id": "s1"}, headers=env.auth("reader")).text
        == lines.text
    )
    assert_error(
        env.client.get("/v1/export", params={"bogus": 1}, headers=env.auth("reader")), 422, field="bogus"
    )
    fresh = {**exported[0], "id": "01a00000-0000-7000-8000-000000000001"}
    del fresh["tenant"]
    assert_error(
        env.client.post("/v1/memories/import", json={"memories": [fresh]}, headers=env.auth()),
        403,
        field="role",
    )
    done = env.client.post(
        "/v1/memories/import", json={"memories": [fresh, exported[0]]}, headers=env.auth("admin")
    ).json()
    assert done == {"imported": 1, "skipped": 1, "renamed": {}, "differing": []}
    edited = {**exported[0], "content": "edited after the export"}
    again = env.client.post("/v1/memories/import", json={"memories": [edited]}, headers=env.auth("admin"))
    assert again.json() == {"imported": 0, "skipped": 1, "renamed": {}, "differing": [edited["id"]]}
    assert env.client.get(f"/v1/memories/{m['id']}", headers=env.auth()).json()["content"] == m["content"]
    assert env.client.get(f"/v1/memories/{fresh['id']}", headers=env.auth()).json()["tenant"] == "acme"
    # an import naming another tenant (another tenant's export) lands in the caller's tenant, never theirs
    planted = {**fresh, "id": "01a00000-0000-7000-8000-000000000002", "tenant": "globex"}
    r = env.client.post("/v1/memories/import", json={"memories": [planted]}, headers=env.auth("admin"))
    assert r.json()["imported"] == 1
    assert env.client.get(f"/v1/memories/{planted['id']}", headers=env.auth()).json()["tenant"] == "acme"
    assert env.client.get("/v1/export", headers=env.auth("other")).text == ""
    before = checksum(env.store)
    # a number past what the engines store (a 64-bit integer) is refused at validation, not by the insert
    huge = {**fresh, "id": "01a00000-0000-7000-8000-000000000003", "version": 2**63}
    r = env.client.post("/v1/memories/import", json={"memories": [huge]}, headers=env.auth("admin"))
    assert r.status_code == 422 and "version" in r.text
    assert checksum(env.store) == before


def test_keys_over_the_api(env: Env) -> None:
    assert env.client.get("/v1/whoami", headers=env.auth("admin")).json()["role"] == "admin"
    made = env.client.post("/v1/keys", json={"role": "read-only", "name": "dash"}, headers=env.auth("admin"))
    assert made.status_code == 201
    key = made.json()["key"]
    assert env.client.get("/v1/whoami", headers={"X-API-Key": key}).json()["tenant"] == "acme"
    listed = env.client.get("/v1/keys", headers=env.auth("admin")).json()
    assert {k["tenant"] for k in listed} == {"acme"} and "key" not in listed[0]
    assert all("hash" not in k for k in listed)
    revoked = env.client.delete(f"/v1/keys/{made.json()['key_id']}", headers=env.auth("admin")).json()
    assert revoked["revoked_at"] is not None
    assert_error(
        env.client.get("/v1/whoami", headers={"X-API-Key": key}), 401, "unauthorized", "Authorization"
    )
    other = env.client.app.state.service.keyring.list("globex")[0]  # type: ignore[attr-defined]
    assert_error(env.client.delete(f"/v1/keys/{other.key_id}", headers=env.auth("admin")), 404, "not_found")
    assert_error(env.client.get("/v1/keys", headers=env.auth("agent")), 403, "forbidden", "role")


def test_authentication_errors(env: Env) -> None:
    assert_error(env.client.get("/v1/memories"), 401, "unauthorized", "Authorization")
    assert_error(env.client.get("/v1/memories", headers={"Authorization": "Bearer nope"}), 401)
    forged = env.keys["agent"][:-4] + "AAAA"
    assert_error(env.client.get("/v1/memories", headers={"Authorization": f"Bearer {forged}"}), 401)
    basic = env.client.get("/v1/memories", headers={"Authorization": "Basic YTpi"})
    assert_error(basic, 401)
    assert "its scheme is 'Basic'" in basic.json()["error"]["message"]
    bare = env.client.get("/v1/memories", headers={"Authorization": env.keys["agent"]})  # no "Bearer"
    assert_error(bare, 401)
    assert "is not 'Bearer <key>'" in bare.json()["error"]["message"]
    assert env.keys["agent"] not in bare.text  # the key is never repeated back
    empty = env.client.get("/v1/memories", headers={"Authorization": "Bearer "})
    assert_error(empty, 401)
    assert "no key after 'Bearer'" in empty.json()["error"]["message"]


def test_an_import_of_an_id_another_tenant_holds_is_neither_refused_nor_shared(env: Env) -> None:
    """globex imports a memory under an id acme holds (and one that links to it): no 403 that would tell,
    no change to acme's memory; globex's copy gets an id of its own, the same at a second import."""
    acme = env.record("acme's own memory")
    their_admin = {
        "Authorization": f"Bearer {env.client.app.state.service.keyring.create('globex', 'admin')[1]}"
    }
    other = "01a00000-0000-7000-8000-0000000000aa"
    body = {
        "memories": [
            {**acme, "content": "globex's memory", "tenant": "globex", "version": 1},
            {"id": other, "content": "globex's note", "links": [{"type": "refers_to", "target": acme["id"]}]},
        ]
    }
    before = checksum(env.store)
    done = env.client.post("/v1/memories/import", json=body, headers=their_admin)
    assert done.status_code == 200, done.text
    renamed = done.json()["renamed"]
    assert done.json()["imported"] == 2 and set(renamed) == {acme["id"]}
    mine = env.client.get(f"/v1/memories/{renamed[acme['id']]}", headers=env.auth("other")).json()
    assert mine["content"] == "globex's memory" and mine["tenant"] == "globex"
    note = env.client.get(f"/v1/memories/{other}", headers=env.auth("other")).json()
    assert note["links"] == [{"type": "refers_to", "target": renamed[acme["id"]]}]
    assert env.client.get(f"/v1/memories/{acme['id']}", headers=env.auth()).json() == acme
    assert_error(env.client.get(f"/v1/memories/{acme['id']}", headers=env.auth("other")), 404, "not_found")
    again = env.client.post("/v1/memories/import", json=body, headers=their_admin).json()
    assert again == {"imported": 0, "skipped": 2, "renamed": renamed, "differing": []}
    assert checksum(env.store) != before


def test_each_tenant_gets_its_own_harness_and_sees_only_its_data(env: Env) -> None:
    mine = env.record("acme's deploy failed: disk full", session_id="s1")
    theirs = env.record("globex's deploy failed: disk full", who="other", session_id="s1")
    assert theirs["tenant"] == "globex"
    for path in (f"/v1/memories/{mine['id']}", f"/v1/memories/{mine['id']}/value"):
        assert_error(env.client.get(path, headers=env.auth("other")), 404, "not_found")
    assert_error(
        env.client.patch(f"/v1/memories/{mine['id']}", json={"state": "error"}, headers=env.auth("other")),
        404,
    )
    assert_error(env.client.delete(f"/v1/memories/{mine['id']}", headers=env.auth("other")), 404)
    hits = env.client.post(
        "/v1/recall", json={"query": "deploy disk full", "k": 10}, headers=env.auth("other")
    ).json()
    assert [h["id"] for h in hits] == [theirs["id"]]
    ctx = env.client.post(
        "/v1/context", json={"query": "deploy", "session_id": "s1"}, headers=env.auth("other")
    ).json()
    assert [e["id"] for e in ctx["manifest"]] == [theirs["id"]]
    events = env.client.get("/v1/events", params={"limit": 1000}, headers=env.auth("other")).json()["events"]
    assert {e["memory_id"] for e in events if e["memory_id"]} == {theirs["id"]}
    assert env.client.get("/v1/stats", headers=env.auth("other")).json()["memories"] == 1
    assert env.client.get(f"/v1/memories/{mine['id']}", headers=env.auth()).status_code == 200


def test_harness_options_reach_every_tenant_harness(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "options.db")
    policies = {"acme": RedactionPolicy.of(["email"]), "*": RedactionPolicy.of([])}  # redaction per tenant
    app = create_app(store, embedder=None, harness_options={"redaction": policies})
    ring = app.state.service.keyring
    acme, globex = ring.create("acme", "agent")[1], ring.create("globex", "agent")[1]
    with TestClient(app) as client:
        text = {"content": "write to ann@example.org"}
        mine = client.post("/v1/memories", json=text, headers={"Authorization": f"Bearer {acme}"}).json()
        theirs = client.post("/v1/memories", json=text, headers={"Authorization": f"Bearer {globex}"}).json()
    assert "ann@example.org" not in mine["content"] and theirs["content"] == text["content"]
    store.close()


class DownSummarizer:
    name = "down"

    def summarize(self, text: str, max_chars: int) -> str:
        raise SummarizerError("the team's summarizer is down")


def test_a_summarizer_of_the_operators_own_that_fails_is_a_502(tmp_path: Path) -> None:
    """It was a 500 internal_error, as if the server had a bug: the model it called failed."""
    store = SQLiteStore(tmp_path / "upstream.db")
    app = create_app(store, embedder=None, harness_options={"summarizer": DownSummarizer()})
    key = app.state.service.keyring.create("acme", "agent")[1]
    auth = {"Authorization": f"Bearer {key}"}
    with TestClient(app) as client:
        made = client.post("/v1/memories", json={"content": "word " * 400}, headers=auth).json()
        r = client.post(f"/v1/memories/{made['id']}/compress", headers=auth)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed"
        assert "down" not in r.text  # the operator's message stays in the log
        assert client.get(f"/v1/memories/{made['id']}", headers=auth).json()["content"] == made["content"]
    store.close()


SECRET = "mail ann@example.org, card 4111 1111 1111 1111"


def test_admins_read_kept_originals_over_the_api_and_no_one_else(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "kept.db")
    options = redaction_options(keep_originals=True, environ={KEY_ENV: DataKey.generate().encode()})
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), harness_options=options)
    ring = app.state.service.keyring
    keys = {
        "admin": ring.create("acme", "admin")[1],
        "agent": ring.create("acme", "agent")[1],
        "reader": ring.create("acme", "read-only")[1],
        "their admin": ring.create("globex", "admin")[1],
    }

    def auth(who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[who]}"}

    with TestClient(app) as client:
        m = client.post("/v1/memories", json={"content": SECRET}, headers=auth("agent")).json()
        assert "ann@example.org" not in m["content"] and "4111" not in m["content"]  # redacted by default
        payload = {"to": "ann@example.org", "n": 1}
        j = client.post("/v1/memories", json={"content": payload}, headers=auth("agent")).json()
        original = client.get(f"/v1/memories/{m['id']}/original", headers=auth("admin"))
        assert original.status_code == 200, original.text
        assert original.json() == {"id": m["id"], "content": SECRET, "content_type": "text/plain"}
        kept_json = client.get(f"/v1/memories/{j['id']}/original", headers=auth("admin")).json()
        assert json.loads(kept_json["content"]) == payload and kept_json["content_type"] == "application/json"
        for who, status in (("agent", 403), ("reader", 403), ("their admin", 404)):
            r = client.get(f"/v1/memories/{m['id']}/original", headers=auth(who))
            assert r.status_code == status, (who, r.text)
            assert set(r.json()["error"]) == ERROR_KEYS
        events = client.get("/v1/events", params={"memory_id": m["id"]}, headers=auth("admin")).json()
        assert [e["kind"] for e in events["events"]].count("reveal") == 1  # every reveal is logged
        hits = client.post("/v1/recall", json={"query": "ann@example.org card"}, headers=auth("admin")).json()
        assert SECRET not in json.dumps(hits)
    store.close()


def keeping_originals(path: Path, key: DataKey) -> tuple[Any, Store, dict[str, str]]:
    """An app whose tenants' harnesses redact and keep originals sealed with ``key``, and acme's admin key."""
    store = SQLiteStore(path)
    options = redaction_options(keep_originals=True, environ={KEY_ENV: key.encode()})
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), harness_options=options)
    admin = app.state.service.keyring.create("acme", "admin")[1]
    return app, store, {"Authorization": f"Bearer {admin}"}


def test_imports_refuse_internal_records_and_foreign_sealed_originals(tmp_path: Path) -> None:
    theirs_app, theirs_store, theirs_auth = keeping_originals(tmp_path / "theirs.db", DataKey.generate())
    with TestClient(theirs_app) as client:
        assert client.post("/v1/memories", json={"content": SECRET}, headers=theirs_auth).status_code == 201
        foreign = [
            json.loads(line) for line in client.get("/v1/export", headers=theirs_auth).text.splitlines()
        ]
    assert "sealed" in foreign[0]["metadata"]["redaction"]
    theirs_store.close()
    app, store, auth = keeping_originals(tmp_path / "ours.db", DataKey.generate())
    with TestClient(app) as client:
        made = client.post("/v1/memories", json={"content": SECRET}, headers=auth).json()
        own = [json.loads(line) for line in client.get("/v1/export", headers=auth).text.splitlines()]
        plain = {"id": "01a00000-0000-7000-8000-0000000000a1", "content": "a plain note"}
        grant = {**plain, "id": "01a00000-0000-7000-8000-0000000000a2", "status": "internal"}
        moved = {**own[0], "id": "01a00000-0000-7000-8000-0000000000a3"}  # our envelope, another memory
        before = checksum(store)
        for batch, field in (
            ([plain, grant], "memories.1.status"),
            ([plain, foreign[0]], "memories.1.metadata.redaction.sealed"),
            ([moved], "memories.0.metadata.redaction.sealed"),
        ):
            r = client.post("/v1/memories/import", json={"memories": batch}, headers=auth)
            err = assert_error(r, 422, "validation_error", field)
            assert err["fix"]
            assert checksum(store) == before  # nothing of the batch is written
        # this store's own export opens with its keys: accepted (and skipped, being present)
        again = client.post("/v1/memories/import", json={"memories": own}, headers=auth)
        assert again.json() == {"imported": 0, "skipped": 1, "renamed": {}, "differing": []}, again.text
        assert client.get(f"/v1/memories/{made['id']}/original", headers=auth).json()["content"] == SECRET
    store.close()


def test_harness_import_refuses_what_a_write_would_and_a_restore_keeps_everything(tmp_path: Path) -> None:
    key = DataKey.generate()
    options = redaction_options(keep_originals=True, environ={KEY_ENV: key.encode()})
    with Harness.open(tmp_path / "a.db", embedder=None, tenant="acme", **options) as h:
        h.grant("docs", "writer", write=True)
        h.record(SECRET)
        backup = list(h.store.iter_all())
    assert {m.status.value for m in backup} == {"internal", "active"}
    other = redaction_options(keep_originals=True, environ={KEY_ENV: DataKey.generate().encode()})
    with Harness.open(tmp_path / "b.db", embedder=None, tenant="acme", **other) as h:
        for memory, field in (
            (next(m for m in backup if m.status.value == "internal"), "memories.0.status"),
            (next(m for m in backup if m.status.value == "active"), "memories.0.metadata.redaction.sealed"),
        ):
            with pytest.raises(ValidationError) as raised:
                h.import_memories([memory])
            assert raised.value.field == field
        assert list(h.store.iter_all()) == []
    with Harness.open(tmp_path / "c.db", embedder=None, tenant="acme", **options) as h:
        assert h.import_memories(backup, restore=True) == 2  # clawvm import: a backup comes back whole
        assert can_write(h, "writer", "docs")  # the grant came back with it


def test_originals_are_not_kept_unless_asked(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "plain.db")
    app = create_app(store, embedder=None, harness_options=redaction_options())
    admin = {"Authorization": f"Bearer {app.state.service.keyring.create('acme', 'admin')[1]}"}
    with TestClient(app) as client:
        m = client.post("/v1/memories", json={"content": SECRET}, headers=admin).json()
        assert "ann@example.org" not in m["content"]
        r = client.get(f"/v1/memories/{m['id']}/original", headers=admin)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    store.close()


def test_keeping_originals_needs_a_data_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=KEY_ENV):
        redaction_options(keep_originals=True, environ={})
    with pytest.raises(ConfigError, match="--redact"):
        redaction_options(redact=False, keep_originals=True)
    assert redaction_options(redact=False) == {}
    assert redaction_options() == {"redaction": RedactionPolicy()}
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    store = SQLiteStore(tmp_path / "nokey.db")
    with pytest.raises(ConfigError, match=KEY_ENV):  # at start, not at a tenant's first request
        create_app(store, embedder=None, harness_options={"redaction": RedactionPolicy(keep_original=True)})
    store.close()


def test_health_and_readiness(env: Env) -> None:
    assert env.client.get("/healthz").json() == {"status": "ok", "checks": {}}
    for probe in ("/healthz", "/readyz"):  # load balancers probe with HEAD: it was a 405
        head = env.client.head(probe)
        assert head.status_code == 200 and head.content == b""
    ready = env.client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["checks"]["store"] == "ok"


def test_options_answers_the_routes_methods_without_a_key_or_a_rate_limit_token(tmp_path: Path) -> None:
    """OPTIONS was a 405 on every route; it reveals only what /openapi.json publishes, so it is answered
    ahead of the key check, as HEAD of a health probe is."""
    hourly = 1 / 3600  # one request an hour, per key and per unauthenticated address
    settings = ServerSettings(
        rate_per_s=hourly, burst=1, unauthenticated_rate_per_s=hourly, unauthenticated_burst=1
    )
    app, store, keys = open_app(tmp_path, settings)
    with TestClient(app) as client:
        agent = {"Authorization": f"Bearer {keys['agent']}"}
        for headers in ({}, agent, {"Authorization": "Bearer nonsense"}):
            for path, allow in (
                ("/v1/memories/m1", "DELETE, GET, OPTIONS, PATCH"),
                ("/healthz", "GET, HEAD, OPTIONS"),
            ):
                r = client.options(path, headers=headers)
                assert (r.status_code, r.headers["allow"], r.content) == (204, allow, b""), r.text
                assert "access-control-allow-origin" not in r.headers  # no CORS: the server has no settings
        assert client.get("/v1/whoami", headers=agent).status_code == 200  # the key's one token was left
        assert client.get("/v1/whoami").status_code == 401  # and the address's one unauthenticated request
        assert_error(client.get("/v1/whoami"), 429, "rate_limited")
        assert_error(client.options("/v1/nothing"), 404, "not_found")  # no route: nothing to allow
        spec = client.get("/openapi.json").json()
        assert not [p for p, ops in spec["paths"].items() if "options" in ops]  # kept out of the schema
    store.close()


def test_unknown_routes_and_methods_use_the_error_schema(env: Env) -> None:
    assert_error(env.client.get("/v1/nothing", headers=env.auth()), 404, "not_found")
    r = env.client.put("/v1/recall", headers=env.auth())
    assert_error(r, 405, "method_not_allowed")
    assert "POST" in r.headers["allow"]


def test_unexpected_errors_are_500_in_the_error_schema_and_mounted_routers_work(tmp_path: Path) -> None:
    extra = APIRouter(prefix="/v1/extra")

    @extra.get("/boom")
    def boom(caller: Writer) -> None:
        raise RuntimeError("secret detail")

    @extra.get("/me")
    def me(caller: Writer) -> dict[str, str]:
        return {"tenant": caller.harness.tenant}

    app, store, keys = open_app(tmp_path, routers=(extra,))
    with TestClient(app, raise_server_exceptions=False) as client:
        auth = {"Authorization": f"Bearer {keys['agent']}"}
        assert client.get("/v1/extra/me", headers=auth).json() == {"tenant": "acme"}
        r = client.get("/v1/extra/boom", headers=auth)
        err = assert_error(r, 500, "internal_error")
        assert "secret detail" not in r.text and r.headers["x-request-id"] in err["fix"]
        assert_error(client.get("/v1/extra/me"), 401)
    store.close()


def test_rate_limit_per_key(tmp_path: Path) -> None:
    app, store, keys = open_app(tmp_path, ServerSettings(rate_per_s=0.5, burst=2))
    with TestClient(app) as client:
        agent = {"Authorization": f"Bearer {keys['agent']}"}
        assert [client.get("/v1/whoami", headers=agent).status_code for _ in range(2)] == [200, 200]
        r = client.get("/v1/whoami", headers=agent)
        assert_error(r, 429, "rate_limited")
        assert int(r.headers["retry-after"]) >= 1
        other = {"Authorization": f"Bearer {keys['other']}"}
        assert client.get("/v1/whoami", headers=other).status_code == 200  # buckets are per key
    store.close()


def test_rate_limiter_refills_with_time() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, 2, clock=lambda: now[0])
    limiter.check("k")
    limiter.check("k")
    with pytest.raises(RateLimitError, match=r"retry after 0\.50"):
        limiter.check("k")
    now[0] += 0.5
    limiter.check("k")  # one token back after half a second at 2/s


def test_one_json_log_line_per_request_without_secrets(env: Env) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("clawvm.server")  # every server module logs under it
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        r = env.client.post(
            "/v1/memories", json={"content": "hello"}, headers={**env.auth(), "X-Request-ID": "req-1"}
        )
        env.client.get("/v1/memories/missing", headers=env.auth())
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    first = lines[0]
    assert r.headers["x-request-id"] == "req-1" == first["request_id"]
    assert first["status"] == 201 and first["path"] == "/v1/memories" and first["tenant"] == "acme"
    assert first["level"] == "info" and first["duration_ms"] >= 0 and first["role"] == "agent"
    assert lines[1]["status"] == 404
    assert env.keys["agent"] not in stream.getvalue() and "hello" not in stream.getvalue()


# ---- bad input: a clear 4xx naming the field, and the store unchanged ------------------------------
BIG_TAGS = [f"t{i}" for i in range(10_000)]
DEEP = b'{"content": "x", "metadata": {"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}"  # past the parser


UNREADABLE_BODIES = [
    pytest.param(b'{"content": ', "invalid_json", id="not JSON"),
    pytest.param(DEEP, "bad_request", id="nested past the parser"),
]


@pytest.mark.parametrize(("body", "code"), UNREADABLE_BODIES)
def test_a_body_that_cannot_be_read_is_answered_after_the_key_check(env: Env, body: bytes, code: str) -> None:
    """FastAPI reads the body before a route's dependencies run: a request with no key (or a key whose
    role may not write) and a body that is not JSON got the 400 that tells how its body fared, where any
    other request of theirs gets 401 (403)."""

    def post(path: str, **headers: str) -> httpx.Response:
        return env.client.post(path, content=body, headers={"Content-Type": "application/json", **headers})

    assert_error(post("/v1/memories"), 401, "unauthorized")
    assert_error(post("/v1/memories", Authorization="Bearer cvm_nothing_nothing"), 401, "unauthorized")
    assert_error(post("/v1/memories", **env.auth("reader")), 403, "forbidden")
    assert_error(post("/v1/memories", **env.auth("agent")), 400, code, "body")
    assert_error(post("/v1/recall", **env.auth("reader")), 400, code, "body")
    assert env.store.count() == 0


def test_unreadable_bodies_without_a_key_spend_the_unauthenticated_limit(tmp_path: Path) -> None:
    """Refused for their body alone, requests without a key were never counted: a client could send them
    without end, and learn how each body fared."""
    settings = ServerSettings(rate_per_s=0, unauthenticated_rate_per_s=1 / 3600, unauthenticated_burst=2)
    app, store, _ = open_app(tmp_path, settings)
    as_json = {"Content-Type": "application/json"}
    with TestClient(app) as client:
        for _ in range(2):
            assert_error(client.post("/v1/memories", content=b"{", headers=as_json), 401, "unauthorized")
        assert_error(client.post("/v1/memories", content=b"{", headers=as_json), 429, "rate_limited")
    store.close()


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": [value]}
    return value


BAD_INPUT: list[tuple[str, str, str, dict[str, Any], int, str, str]] = [
    # (case, method, path, request kwargs, status, code, field)
    (
        "oversized body",
        "POST",
        "/v1/memories",
        {"json": {"content": "x" * 3_000_000}},
        413,
        "payload_too_large",
        "body",
    ),
    (
        "oversized chunked body",
        "POST",
        "/v1/memories",
        {"content": iter([b'{"content": "', b"x" * 3_000_000, b'"}'])},
        413,
        "payload_too_large",
        "body",
    ),
    (
        "content over the library limit",
        "POST",
        "/v1/memories",
        {"json": {"content": "x" * 1_500_000}},
        422,
        "validation_error",
        "content",
    ),
    (
        "invalid UTF-8",
        "POST",
        "/v1/memories",
        {"content": b'{"content": "caf\xe9"}'},
        400,
        "invalid_utf8",
        "body",
    ),
    (
        "lone surrogate escape",
        "POST",
        "/v1/memories",
        {"content": b'{"content": "a\\ud800b"}'},
        422,
        "validation_error",
        "content",
    ),
    (
        "surrogate in metadata",
        "POST",
        "/v1/memories",
        {"content": b'{"content": "a", "metadata": {"k": "\\udfff"}}'},
        422,
        "validation_error",
        "metadata",
    ),
    ("invalid UTF-8 in a path id", "GET", "/v1/memories/%FF", {}, 400, "invalid_utf8", "memory_id"),
    (
        "invalid UTF-8 in a path id of a write",
        "POST",
        "/v1/checkpoints/ab%C3%28/rollback",
        {},
        400,
        "invalid_utf8",
        "checkpoint_id",
    ),
    (
        "invalid UTF-8 in a session id",
        "POST",
        "/v1/sessions/s%FE1/checkpoints",
        {"json": {"name": "x"}},
        400,
        "invalid_utf8",
        "session_id",
    ),
    ("invalid UTF-8 outside a parameter", "GET", "/v1/mem%FFories", {}, 400, "invalid_utf8", "path"),
    ("not JSON", "POST", "/v1/memories", {"content": b'{"content": '}, 400, "invalid_json", "body"),
    (
        "an export's JSON Lines sent to import as they are",
        "POST",
        "/v1/memories/import",
        {"content": b'{"content": "a"}\n{"content": "b"}\n'},
        400,
        "invalid_json",
        "body",
    ),
    ("deeply nested JSON", "POST", "/v1/memories", {"content": DEEP}, 400, "bad_request", "body"),
    # parsable, but deeper than the store could serialize
    (
        "deep metadata",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "metadata": nested(150)}},
        422,
        "validation_error",
        "metadata",
    ),
    (
        "deep JSON content",
        "POST",
        "/v1/memories",
        {"json": {"content": nested(150)}},
        422,
        "validation_error",
        "content",
    ),
    (
        "deep metadata in an import",
        "POST",
        "/v1/memories/import",
        {"json": {"memories": [{"content": "x", "metadata": nested(150)}]}},
        422,
        "validation_error",
        "memories.0.metadata",  # refused by the Memory model itself (clawvm.core.model.MAX_JSON_DEPTH)
    ),
    ("JSON array body", "POST", "/v1/memories", {"json": ["content"]}, 422, "validation_error", "body"),
    ("empty body", "POST", "/v1/memories", {}, 422, "validation_error", "body"),
    (
        "NaN",
        "POST",
        "/v1/memories",
        {"content": b'{"content": "x", "confidence": NaN}'},
        422,
        "validation_error",
        "confidence",
    ),
    (
        "unknown enum: kind",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "kind": "gossip"}},
        422,
        "validation_error",
        "kind",
    ),
    (
        "unknown enum: state",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "state": "done"}},
        422,
        "validation_error",
        "state",
    ),
    (
        "unknown enum: link type",
        "POST",
        "/v1/memories",
        {
            "json": {
                "content": "x",
                "links": [{"type": "likes", "target": "01a00000-0000-7000-8000-000000000001"}],
            }
        },
        422,
        "validation_error",
        "links.0.type",
    ),
    (
        "unknown enum in a filter",
        "POST",
        "/v1/recall",
        {"json": {"query": "x", "filters": {"tier": ["hot"]}}},
        422,
        "validation_error",
        "filters.tier.0",
    ),
    (
        "unknown enum in a query",
        "GET",
        "/v1/memories",
        {"params": {"status": "gone"}},
        422,
        "validation_error",
        "status.0",
    ),
    (
        "unknown preset",
        "POST",
        "/v1/recall",
        {"json": {"query": "x", "preset": "magic"}},
        422,
        "validation_error",
        "preset",
    ),
    (
        "wrong type: content",
        "POST",
        "/v1/memories",
        {"json": {"content": 5}},
        422,
        "validation_error",
        "content",
    ),
    (
        "wrong type: tags",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "tags": "ci"}},
        422,
        "validation_error",
        "tags",
    ),
    (
        "wrong type: k",
        "POST",
        "/v1/recall",
        {"json": {"query": "x", "k": "ten"}},
        422,
        "validation_error",
        "k",
    ),
    (
        "wrong type: metadata",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "metadata": [1]}},
        422,
        "validation_error",
        "metadata",
    ),
    (
        "wrong type: limit",
        "GET",
        "/v1/memories",
        {"params": {"limit": "many"}},
        422,
        "validation_error",
        "limit",
    ),
    (
        "out of range: budget",
        "POST",
        "/v1/context",
        {"json": {"budget_tokens": 0}},
        422,
        "validation_error",
        "budget_tokens",
    ),
    (
        "out of range: after_seq",
        "GET",
        "/v1/events",
        {"params": {"after_seq": 2**70}},
        422,
        "validation_error",
        "after_seq",
    ),
    (
        "date out of range",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "expires_at": "0001-01-01T00:00:00+05:00"}},
        422,
        "validation_error",
        "expires_at",
    ),
    (
        "a date-time that is not RFC 3339 (a space for the T)",
        "GET",
        "/v1/memories",
        {"params": {"created_after": "2026-01-31 12:00:00Z"}},
        422,
        "validation_error",
        "created_after",
    ),
    (
        "a date in ISO 8601's basic form (1053-11-20), which is no RFC 3339 date-time",
        "GET",
        "/v1/memories",
        {"params": {"created_after": "10531120"}},
        422,
        "validation_error",
        "created_after",
    ),
    (
        "huge tag list",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "tags": BIG_TAGS}},
        422,
        "validation_error",
        "tags",
    ),
    (
        "huge tag filter",
        "POST",
        "/v1/recall",
        {"json": {"query": "x", "filters": {"tags": BIG_TAGS}}},
        422,
        "validation_error",
        "filters.tags",
    ),
    (
        "tag too long",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "tags": ["t" * 300]}},
        422,
        "validation_error",
        "tags.0",
    ),
    (
        "link to a non-id",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "links": [{"type": "refers_to", "target": "nope"}]}},
        422,
        "validation_error",
        "links.0.target",
    ),
    (
        "bad embedding",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "embedding": [0.1, 0.2]}},
        422,
        "validation_error",
        "embedding",
    ),
    (
        "unknown field",
        "POST",
        "/v1/memories",
        {"json": {"content": "x", "tenant": "globex"}},
        422,
        "validation_error",
        "tenant",
    ),
    (
        "unknown query parameter",
        "GET",
        "/v1/memories",
        {"params": {"tenant": "globex"}},
        422,
        "validation_error",
        "tenant",
    ),
    (
        "missing content",
        "POST",
        "/v1/memories",
        {"json": {"kind": "note"}},
        422,
        "validation_error",
        "content",
    ),
    (
        "blank content",
        "POST",
        "/v1/memories",
        {"json": {"content": "  "}},
        422,
        "validation_error",
        "content",
    ),
    (
        "content of only a zero-width space and a byte order mark",
        "POST",
        "/v1/memories",
        {"json": {"content": "\u200b \ufeff"}},
        422,
        "validation_error",
        "content",
    ),
    ("over-long path id", "GET", "/v1/memories/" + "a" * 200, {}, 422, "validation_error", "memory_id"),
    # a key given twice: the last value was read and the first dropped unseen
    (
        "a key given twice",
        "POST",
        "/v1/memories",
        {"content": b'{"content": "a", "content": "b"}'},
        422,
        "validation_error",
        "content",
    ),
    (
        "a key given twice in metadata",
        "POST",
        "/v1/memories",
        {"content": b'{"content": "a", "metadata": {"k": 1, "k": 2}}'},
        422,
        "validation_error",
        "metadata.k",
    ),
    (
        "a key given twice in a list's object",
        "POST",
        "/v1/memories/import",
        {"content": b'{"memories": [{"content": "a"}, {"content": "b", "tags": [], "tags": ["x"]}]}'},
        422,
        "validation_error",
        "memories.1.tags",
    ),
    (
        "a key given twice in the dashboard's API",
        "POST",
        "/dashboard/api/memories/m1/annotate",
        {"content": b'{"note": "a", "note": "b"}'},
        422,
        "validation_error",
        "note",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code", "field"),
    [case[1:] for case in BAD_INPUT],
    ids=[case[0] for case in BAD_INPUT],
)
def test_bad_input_is_a_clear_4xx_and_changes_nothing(
    env: Env, method: str, path: str, kwargs: dict[str, Any], status: int, code: str, field: str
) -> None:
    env.record(session_id="s1", tags=["ci"])
    before = checksum(env.store)
    headers = {**env.auth("admin"), "content-type": "application/json"}
    r = env.client.request(method, path, headers=headers, **kwargs)
    assert_error(r, status, code, field)
    assert checksum(env.store) == before


def test_a_json_object_sent_without_its_content_type_is_told_to_send_the_header(env: Env) -> None:
    """``curl -d '{...}'`` sends a form content type: the body is then not an object to FastAPI, and the
    fix must point at the header, not at a JSON object the caller did send."""
    headers = {**env.auth(), "content-type": "application/x-www-form-urlencoded"}
    r = env.client.post("/v1/memories", content=b'{"content": "a note"}', headers=headers)
    err = assert_error(r, 422, "validation_error", "body")
    assert "Content-Type: application/json" in err["fix"]
    assert env.store.count() == 0


def test_an_export_sent_to_import_as_it_is_is_told_the_body_import_takes(env: Env) -> None:
    """``GET /v1/export`` answers JSON Lines; sent to the import as they are, the second line was
    "Extra data" and the fix "send JSON", which the caller thought they had."""
    env.client.post("/v1/memories", json={"content": "first"}, headers=env.auth())
    env.client.post("/v1/memories", json={"content": "second"}, headers=env.auth())
    exported = env.client.get("/v1/export", headers=env.auth()).content
    headers = {**env.auth("admin"), "content-type": "application/json"}
    sent = env.client.post("/v1/memories/import", content=exported, headers=headers)
    err = assert_error(sent, 400, "invalid_json", "body")
    assert '{"memories": [...]}' in err["fix"] and "/v1/export" in err["fix"]
    lines = [json.loads(line) for line in exported.splitlines()]
    r = env.client.post("/v1/memories/import", json={"memories": lines}, headers=env.auth("admin"))
    assert r.status_code == 200, r.text  # the fix, followed, restores the export
    assert env.store.count() == 2


def test_a_key_given_twice_is_refused_only_within_one_object(env: Env) -> None:
    body = b'{"content": "a", "metadata": {"content": "b", "deep": {"content": "c"}}, "tags": ["a", "a"]}'
    json_type = {"content-type": "application/json"}
    r = env.client.post("/v1/memories", content=body, headers={**env.auth(), **json_type})
    assert r.status_code == 201, r.text
    twice = b'{"content": "a", "content": "b"}'
    r = env.client.post("/v1/memories", content=twice, headers={"content-type": "application/merge+json"})
    err = assert_error(r, 422, "validation_error", "content")  # every JSON type, before the key is asked
    assert "once" in err["fix"] and env.store.count() == 1
    # a body past the inline size is read on a worker thread: refused all the same, naming the key
    padding = "x" * JSON_INLINE_BYTES
    big = f'{{"content": "{padding}", "metadata": {{"k": 1, "k": 2}}}}'.encode()
    r = env.client.post("/v1/memories", content=big, headers={**env.auth(), **json_type})
    assert_error(r, 422, "validation_error", "metadata.k")
    assert env.store.count() == 1


def test_a_key_given_twice_is_refused_in_a_body_sent_without_a_content_type(tmp_path: Path) -> None:
    """The check ran only for a JSON content type, but FastAPI before 0.132 (which the project allows), or a
    router made with ``strict_content_type=False``, reads a body without one as JSON: the last value won."""
    lax = APIRouter(**_lax_content_type())

    @lax.post("/echo")
    def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    app, store, keys = open_app(tmp_path, routers=(lax,))
    auth = {"Authorization": f"Bearer {keys['agent']}"}
    with TestClient(app) as client:
        assert client.post("/echo", content=b'{"a": 1}').json() == {"a": 1}  # read as JSON, no type given
        assert_error(client.post("/echo", content=b'{"a": 1, "a": 2}'), 422, "validation_error", "a")
        twice = client.post("/v1/memories", content=b'{"content": "a", "content": "b"}', headers=auth)
        assert_error(twice, 422, "validation_error", "content")
        # a body that is no JSON is left to the route: its own 422, with how to send JSON
        err = assert_error(client.post("/v1/memories", content=b"content=a", headers=auth), 422, field="body")
        assert "Content-Type" in (err["fix"] or "")
        assert store.count() == 0
    store.close()


def _lax_content_type() -> dict[str, Any]:
    """An APIRouter's keyword reading a body without a content type as JSON (the default before 0.132)."""
    takes = "strict_content_type" in inspect.signature(APIRouter).parameters
    return {"strict_content_type": False} if takes else {}


# ---- end to end over a real socket --------------------------------------------------------------------
@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, Store, dict[str, str]]]:
    app, store, keys = open_app(tmp_path)
    try:
        with serve_app(app) as url:
            yield url, store, keys
    finally:
        store.close()


def test_end_to_end_over_loopback(live: tuple[str, Store, dict[str, str]]) -> None:
    url, store, keys = live
    auth = {"Authorization": f"Bearer {keys['agent']}"}
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/readyz").status_code == 200
        m = http.post(
            "/v1/memories",
            json={"content": "payment API timed out after 10 s", "tags": ["api"]},
            headers=auth,
        ).json()
        hits = http.post("/v1/recall", json={"query": "which API timed out?"}, headers=auth).json()
        assert hits[0]["id"] == m["id"]
        assert store.get(m["id"]).tenant == "acme"  # written through to the real file
        spec = http.get("/openapi.json").json()
        assert "/v1/recall" in spec["paths"] and "HTTPBearer" in spec["components"]["securitySchemes"]
        before = checksum(store)
        bad = http.post(
            "/v1/memories",
            content=b'{"content": "\xff\xfe"}',
            headers={**auth, "content-type": "application/json"},
        )
        assert_error(bad, 400, "invalid_utf8", "body")
        assert_error(http.get("/v1/memories/%FF", headers=auth), 400, "invalid_utf8", "memory_id")
        assert_error(http.get("/v1/memories"), 401, "unauthorized")
        assert checksum(store) == before
    # a declared length over the limit is refused before the body is read
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(
            b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999\r\nConnection: close\r\n\r\n"
        )
        reply = b"".join(iter(lambda: raw.recv(65536), b"")).decode("latin-1")
    assert reply.startswith("HTTP/1.1 413") and '"payload_too_large"' in reply


# ---- the live event stream (server-sent events) -----------------------------------------------------------
STREAM = "/v1/events/stream"


def sse_messages(text: str) -> list[dict[str, str]]:
    """The messages of an event-stream body, each as {field: value} (comment lines under "comment")."""
    out: list[dict[str, str]] = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in filter(None, block.split("\n")):
            name, _, value = line.partition(":")
            fields[name or "comment"] = value.removeprefix(" ")
        if fields:
            out.append(fields)
    return out


def test_event_stream_sends_the_tenants_events_as_sse_and_resumes_after_last_event_id(env: Env) -> None:
    mine = env.record(session_id="s1")
    env.record("globex's own note", who="other")
    env.client.post(f"/v1/memories/{mine['id']}/pin", headers=env.auth())
    page = env.client.get("/v1/events", params={"limit": 1000}, headers=env.auth("reader")).json()["events"]
    assert len(page) >= 2

    r = env.client.get(STREAM, params={"max_s": 0.2}, headers=env.auth("reader"))  # max_s: the body ends
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    messages = sse_messages(r.text)
    assert messages[0] == {"retry": "2000", "comment": "open"}
    data = [m for m in messages if "data" in m]
    assert [json.loads(m["data"]) for m in data] == page  # the JSON of /v1/events, this tenant's only
    assert [int(m["id"]) for m in data] == [e["seq"] for e in page]

    resumed = env.client.get(  # a reconnecting EventSource sends the last id it saw; it wins over after_seq
        STREAM,
        params={"max_s": 0.2, "after_seq": 0},
        headers={**env.auth(), "Last-Event-ID": str(page[0]["seq"])},
    )
    assert [json.loads(m["data"]) for m in sse_messages(resumed.text) if "data" in m] == page[1:]
    assert_error(env.client.get(STREAM, params={"max_s": 0.2}), 401, "unauthorized")
    bad_id = {**env.auth(), "Last-Event-ID": "x1"}
    assert_error(env.client.get(STREAM, params={"max_s": 0.2}, headers=bad_id), 422, "validation_error")
    assert_error(env.client.get(STREAM, params={"max_s": 0}, headers=env.auth()), 422, "validation_error")


@pytest.fixture
def quick_live(tmp_path: Path) -> Iterator[tuple[str, Any, dict[str, str]]]:
    """A real server whose streams beat every 0.2 s and read the (SQLite) log every 0.05 s."""
    settings = ServerSettings(rate_per_s=0, heartbeat_s=0.2, events_poll_s=0.05)
    app, store, keys = open_app(tmp_path, settings)
    try:
        with serve_app(app) as url:
            yield url, app.state.service, keys
    finally:
        store.close()


def _until(check: Any) -> None:
    """Wait for ``check()`` (a bound on a hang, not a timing assertion)."""
    for _ in range(1000):
        if check():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in 20 s")


def test_event_stream_pushes_new_events_live_and_ends_once_its_key_is_revoked(
    quick_live: tuple[str, Any, dict[str, str]],
) -> None:
    url, service, keys = quick_live
    auth = {k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()}
    with (
        httpx.Client(base_url=url, timeout=30) as http,
        http.stream("GET", STREAM, headers=auth["reader"]) as s,
    ):
        lines = s.iter_lines()
        assert [next(lines), next(lines)] == ["retry: 2000", ": open"]
        http.post("/v1/memories", json={"content": "globex writes too"}, headers=auth["other"])
        m = http.post("/v1/memories", json={"content": "the deploy failed"}, headers=auth["agent"]).json()
        seen: list[dict[str, Any]] = []
        for line in lines:
            if line.startswith("data: "):
                seen.append(json.loads(line.removeprefix("data: ")))
                if seen[-1]["memory_id"] == m["id"]:
                    break
        assert seen[-1]["kind"] == "add" and {e["tenant"] for e in seen} == {"acme"}
        assert next(line for line in lines if line.startswith(":")) == ": heartbeat"  # quiet: it beats
        reader_id = next(
            k["key_id"] for k in http.get("/v1/keys", headers=auth["admin"]).json() if k["name"] == "viewer"
        )
        assert http.delete(f"/v1/keys/{reader_id}", headers=auth["admin"]).status_code == 200
        assert not [line for line in lines if line.startswith("data: ")]  # the stream ends: the loop finishes
    _until(lambda: service.live.following == 0)


def test_a_client_that_hangs_up_ends_its_stream_on_the_server(
    quick_live: tuple[str, Any, dict[str, str]],
) -> None:
    url, service, keys = quick_live
    with httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(3):
            with http.stream("GET", STREAM, headers={"Authorization": f"Bearer {keys['reader']}"}) as s:
                lines = s.iter_lines()  # kept: a dropped iterator would already hang up
                assert next(lines) == "retry: 2000"
                _until(lambda: service.live.following == 1)
            _until(lambda: service.live.following == 0)  # closed by the client: unsubscribed


# ---- schemathesis over the whole OpenAPI spec -----------------------------------------------------------
FUZZ_EXAMPLES = 6  # per operation and generation mode: ~50 operations, so the whole run stays well under 60 s
FUZZ_NEGATIVE = 4


def test_openapi_fuzzing_finds_no_5xx_and_only_schema_errors(tmp_path: Path) -> None:
    app, store, keys = open_app(tmp_path)
    with TestClient(app) as client:
        auth = {"Authorization": f"Bearer {keys['admin']}"}
        real = client.post(
            "/v1/memories",
            json={"content": "the deploy failed: disk full", "session_id": "s1", "task_id": "t1"},
            headers=auth,
        ).json()
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 25
        seen: dict[int, int] = {}
        for op in operations:
            if op.path == "/v1/events/stream":
                continue  # a live stream does not end by itself; see the event-stream tests above
            names = [p.name for p in op.path_parameters]
            real_params = {n: real["id"] if n in ("memory_id", "checkpoint_id") else "s1" for n in names}
            _fuzz(op.as_strategy(GenerationMode.POSITIVE, headers=auth), FUZZ_EXAMPLES, seen)
            if names and "key_id" not in names:  # also on a real memory / session (not on the admin's key)
                strategy = op.as_strategy(GenerationMode.POSITIVE, headers=auth, path_parameters=real_params)
                _fuzz(strategy, FUZZ_EXAMPLES, seen)
            if len(op.query) or len(op.body):  # invalid bodies and queries (only those have much to break)
                _fuzz(op.as_strategy(GenerationMode.NEGATIVE, headers=auth), FUZZ_NEGATIVE, seen)
        assert sum(seen.values()) > 100 and any(200 <= s < 300 for s in seen)
    store.close()


def _fuzz(strategy: st.SearchStrategy[Any], n: int, seen: dict[int, int]) -> None:
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        response = case.call()
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:300]}"
        if response.status_code >= 400:
            body = response.json()
            assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, response.text[:300]
        case.validate_response(
            response, checks=[status_code_conformance, content_type_conformance, response_schema_conformance]
        )

    run()


def test_the_request_log_keeps_no_secret_a_path_names(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """A session called after an email was stored redacted but logged in clear, in every request line."""
    secret = "eve.secret@example.org"
    with caplog.at_level(logging.INFO):
        r = env.client.post(f"/v1/sessions/{secret}/checkpoints", json={"name": "cp"}, headers=env.auth())
    assert r.status_code in (200, 201), r.text
    lines = [rec for rec in caplog.records if rec.getMessage() == "request"]
    assert lines and all(secret not in str(getattr(rec, "fields", "")) for rec in lines)
    assert any("/v1/sessions/[EMAIL]/checkpoints" in str(getattr(rec, "fields", "")) for rec in lines)


@pytest.mark.parametrize(
    ("method", "path", "accept", "counted"),
    [
        ("GET", "/mcp", "text/event-stream", False),  # an MCP client's standing stream: held for its session
        ("GET", "/v1/events/stream", "*/*", False),
        ("POST", "/mcp", "application/json, text/event-stream", True),  # a tool call: work
        ("GET", "/v1/memories", "application/json", True),
    ],
)
def test_the_request_gauge_leaves_out_event_streams_only(
    method: str, path: str, accept: str, counted: bool
) -> None:
    """The embedding worker yields while a request is in flight; an MCP client's GET stream stayed in flight
    for its whole session, so the worker waited before every batch as long as any MCP client was
    connected."""
    gauge = RequestGauge()
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(gauge.in_flight)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"accept", accept.encode())],
    }
    asyncio.run(Guard(app, 1024, gauge)(scope, receive, send))
    assert seen == [1 if counted else 0] and gauge.in_flight == 0
