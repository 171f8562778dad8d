"""The OpenAPI spec matches the server's behaviour: schemathesis's engine (its examples, coverage and
fuzzing phases) with every check over the ASGI app, authenticated with an admin key,
finds no failure: strict request types, the errors each operation answers documented, ``Allow`` on a 405
listing exactly the path's methods, the response headers declared (``X-Request-ID`` on every response),
schema-valid requests accepted and schema-violating ones refused."""

from __future__ import annotations

from pathlib import Path

import schemathesis
from fastapi.testclient import TestClient
from schemathesis.engine import Status, events, from_schema
from schemathesis.engine.recorder import ScenarioRecorder

from clawvm.server import ServerSettings, create_app
from clawvm.store import SQLiteStore

#: per operation and phase: small, so the whole run stays well under a minute on two cores
MAX_EXAMPLES = 4
NO_LIMITS = ServerSettings(rate_per_s=0, tenant_rate_per_s=0, mint_rate_per_s=0, unauthenticated_rate_per_s=0)


def test_schemathesis_with_every_check_finds_no_failure(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "contract.db")
    app = create_app(store, embedder=None, settings=NO_LIMITS)
    admin = app.state.service.keyring.create("acme", "admin", "contract")[1]
    with TestClient(app) as client:  # a memory and a session to reach past 404s
        auth = {"Authorization": f"Bearer {admin}"}
        assert client.post(
            "/v1/memories", json={"content": "the deploy failed", "session_id": "s1"}, headers=auth
        )
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        schema.config.update(headers=auth)
        schema.config.generation.update(max_examples=MAX_EXAMPLES)
        schema.config.checks.update(included_check_names=["all"])
        # stateful sequences are left out: they feed values taken from responses into later requests and
        # then judge those requests as schema-valid whatever the values are (and they double the run)
        schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])
        schema = schema.exclude(path="/v1/events/stream")  # a live stream does not end by itself
        schema = schema.exclude(path="/v1/keys/{key_id}", method="DELETE")  # would revoke the admin's key
        failures: list[str] = []
        tested = 0
        for event in from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished):
                tested += 1
                failures.extend(_failures(event.recorder))
            elif isinstance(event, events.NonFatalError | events.FatalError):
                failures.append(
                    f"engine error: {getattr(event, 'value', getattr(event, 'exception', None))!r}"
                )
        assert tested > 40
        assert not failures, "\n".join(sorted(set(failures)))
    store.close()


def _failures(recorder: ScenarioRecorder) -> list[str]:
    """Each failed check of a scenario: the operation, the check, the request and the answer."""
    found = []
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.status != Status.FAILURE:
                continue
            interaction = recorder.interactions.get(case_id)
            request = response = ""
            if interaction is not None:
                sent = interaction.request
                request = f"{sent.method} {sent.uri} {sent.body!r:.300}"
                if interaction.response is not None:
                    response = f"{interaction.response.status_code} {interaction.response.content!r:.300}"
            title = check.failure_info.failure.title if check.failure_info else ""
            found.append(f"{recorder.label}: {check.name} ({title})\n    {request}\n    -> {response}")
    return found


def test_what_the_spec_states_is_what_the_server_does(tmp_path: Path) -> None:
    """The fixes the fuzzing above keeps honest, each checked once by hand."""
    store = SQLiteStore(tmp_path / "edges.db")
    app = create_app(store, embedder=None, settings=NO_LIMITS)
    auth = {"Authorization": f"Bearer {app.state.service.keyring.create('acme', 'admin')[1]}"}
    with TestClient(app) as client:
        m = client.post("/v1/memories", json={"content": "the deploy failed"}, headers=auth).json()
        # a 405 names every method of the path (Starlette's names only the first route's), OPTIONS included
        r = client.put(f"/v1/memories/{m['id']}", headers=auth)
        assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET, OPTIONS, PATCH"
        assert client.put("/healthz").headers["allow"] == "GET, HEAD, OPTIONS"
        # an OPTIONS is a 204 naming them (it was a 405), the most literal route's for an overlapping path
        for path, allow in (("/v1/keys", "GET, OPTIONS, POST"), ("/v1/memories/import", "OPTIONS, POST")):
            r = client.options(path, headers=auth)
            assert (r.status_code, r.headers["allow"], r.content) == (204, allow, b""), r.text
        # strict bodies: no text for numbers, no numbers for booleans or datetimes; 3.0 is an integer
        for body in ({"track": 0}, {"k": "3"}, {"k": True}, {"filters": {"created_before": 0}}):
            r = client.post("/v1/recall", json={"query": "deploy", **body}, headers=auth)
            assert r.status_code == 422, (body, r.text)
        assert client.post("/v1/recall", json={"query": "deploy", "k": 3.0}, headers=auth).status_code == 200
        assert client.get("/v1/memories", params={"created_before": "0"}, headers=auth).status_code == 422
        assert client.get("/v1/memories", params={"pinned": "false"}, headers=auth).status_code == 200
        # a memory's state forbidding a change is a conflict, not a malformed request
        assert client.patch(f"/v1/memories/{m['id']}", json={"status": "obsolete"}, headers=auth).is_success
        # expired is the end of a TTL, which nothing undoes: the spec leaves it out of what a change may set
        r = client.patch(f"/v1/memories/{m['id']}", json={"status": "expired"}, headers=auth)
        assert r.status_code == 422 and r.json()["error"]["field"] == "status", r.text
        patch = client.get("/openapi.json").json()["components"]["schemas"]["UpdateRequest"]
        assert "expired" not in str(patch["properties"]["status"]) and "archived" in str(patch)
        r = client.post(f"/v1/memories/{m['id']}/pin", headers=auth)
        assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_state", r.text
        # so is a parent that is the memory itself (a cycle of one, as a longer cycle is): schema-valid, it
        # was a 422 that the fuzzing above flagged whenever it named the stored memory in both places
        r = client.patch(f"/v1/memories/{m['id']}", json={"parent_id": m["id"]}, headers=auth)
        assert r.status_code == 409 and "own id" in r.json()["error"]["message"], r.text
        # the headers the server sends are declared where it sends them (none were): X-Request-ID on every
        # response, Retry-After on a 429, Idempotent-Replayed on a keyed create's 201
        document = client.get("/openapi.json").json()
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                for status, response in operation["responses"].items():
                    headers = response.get("headers", {})
                    assert "X-Request-ID" in headers, (method, path, status)
                    assert ("Retry-After" in headers) == (status == "429"), (method, path, status)
                    keyed = status == "201" and "Idempotency-Key" in str(operation.get("parameters"))
                    assert ("Idempotent-Replayed" in headers) == keyed, (method, path, status)
        assert document["components"]["headers"]["X-Request-ID"]["required"] is True
        assert document["paths"]["/v1/sessions/{session_id}/checkpoints"]["post"]["responses"]["201"][
            "headers"
        ]["Idempotent-Replayed"]["schema"] == {"type": "string", "enum": ["true"]}
        # the schema says what the checks refuse: ids, non-blank content, presets, the vector's length
        spec = document["components"]["schemas"]
        embedding = spec["RecordRequest"]["properties"]["embedding"]["anyOf"][0]
        assert embedding["maxItems"] == store.dim and "contains" in embedding  # a direction: not all 0
        assert "pattern" in spec["Link"]["properties"]["target"]
        assert "internal" not in spec["UpdateRequest"]["properties"]["status"]["anyOf"][0]["enum"]
    store.close()
