"""Redaction covers every free-text field a caller gives, not only ``content``.

For each field -- content, tags, metadata (nested values and keys), the scope ids (``session_id``,
``agent_id``, ``task_id``, ``tool_name``, ``team_id``), checkpoint names, a session start's task text,
dashboard annotations and imports -- an AWS access key, an e-mail address and a PEM private key (the ids
get the first two) are planted through the SDK (:class:`clawvm.Harness`) and through REST (the FastAPI
app, run as ``clawvm serve`` runs it: every kind redacted, originals sealed), each field and surface with
secrets of its own. Then:

1. the raw bytes of the SQLite file and its WAL hold none of them; nor do the raw rows and events of the
   memory engine and of a real PostgreSQL (every table of the store's schema, read as text);
2. no response to a non-admin key (memories got and listed, recall, context, events, export, stats, every
   dashboard view) holds a planted secret, nor the sealed envelope of any original (its length tells the
   original's length); an admin still reveals the original.

Scope ids are identifiers: a secret-looking one is stored in one redacted form per original, so the
memories of one session stay together, two such sessions stay apart, and a caller filtering by the id it
recorded with finds them. One server and one SQLite file serve every field (one module fixture).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import psycopg
import pytest
from fastapi.testclient import TestClient

from clawvm import AccessDeniedError, Harness
from clawvm.core.model import Filters, build_memory
from clawvm.core.redact import RedactionPolicy, redact, redact_identifier
from clawvm.observe import learning
from clawvm.server.app import ServerSettings, create_app
from clawvm.store import SQLiteStore, Store
from clawvm.store.crypto import KEY_ENV, DataKey, sealed_envelope
from clawvm.teams import shared as teams
from clawvm.write.redaction import redaction_options
from engines import harness_target

TENANT = "acme"


# ---- what is planted -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Secrets:
    """The secrets planted in one field through one surface (each its own, so a leak names its field)."""

    aws: str
    email: str
    pem: str
    pem_body: str

    @classmethod
    def of(cls, field: str, surface: str) -> Secrets:
        digest = hashlib.sha256(f"{surface}/{field}".encode()).digest()
        aws = "AKIA" + base64.b32encode(digest).decode()[:16]  # the access key id's alphabet: A-Z, 2-7
        email = f"{field.replace('_', '.')}.{digest.hex()[:6]}@northwind-mail.com"
        body = base64.b64encode(digest).decode()  # 44 characters: the block fits a checkpoint name
        pem = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----"
        return cls(aws, email, pem, body)

    @property
    def text(self) -> str:
        """Free text holding all three."""
        return f"deploy with {self.aws}, ask {self.email}, key {self.pem}"

    @property
    def telltales(self) -> dict[str, str]:
        """What must never show in clear: each secret, and pieces that would betray a half-redacted one."""
        return {
            "aws key": self.aws,
            "aws key's tail": self.aws[4:],
            "e-mail": self.email,
            "e-mail's user": self.email.split("@")[0],
            "pem body": self.pem_body,
            "pem body's head": self.pem_body[:24],
        }

    def leaks(self, data: bytes | str) -> list[str]:
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        return [name for name, secret in self.telltales.items() if secret.encode() in raw]


def secret_ids(s: Secrets) -> tuple[str, str]:
    """Two scope ids holding secrets: one with the AWS key (recorded on two memories), one an e-mail."""
    return f"run-{s.aws}", s.email


# ---- how each field is planted, through the SDK and through REST -------------------------------------------
class Rest:
    """The REST app's client with acme's keys; keeps each response to a non-admin key (check 2 reads them)."""

    def __init__(self, client: TestClient, keys: dict[str, str]) -> None:
        self.client = client
        self.keys = keys
        self.seen: list[tuple[str, str]] = []  # (what, body) of each non-admin response

    def call(self, method: str, url: str, body: Any = None, who: str = "agent", **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.keys[who]}"}
        r = self.client.request(method, url, json=body, headers=headers, params=params or None)
        assert r.is_success, f"{method} {url} as {who}: {r.status_code} {r.text}"
        if who != "admin":
            self.seen.append((f"{method} {url} as {who}", r.text))
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text


def _sdk_scope(name: str) -> Callable[[Harness, Secrets], None]:
    def plant(h: Harness, s: Secrets) -> None:
        by_key, by_email = secret_ids(s)
        for i, value in enumerate((by_key, by_key, by_email)):
            h.record(f"scoped note {i} of {name}", **{name: value})

    return plant


def _rest_scope(name: str) -> Callable[[Rest, Secrets], None]:
    def plant(rest: Rest, s: Secrets) -> None:
        by_key, by_email = secret_ids(s)
        for i, value in enumerate((by_key, by_key, by_email)):
            rest.call("POST", "/v1/memories", {"content": f"scoped note {i} of {name}", name: value})

    return plant


def _metadata(s: Secrets) -> dict[str, Any]:
    return {"note": s.pem, "nested": {"deep": [f"key {s.aws}", {"who": s.email}]}, s.email: 1}


def _imported(s: Secrets) -> dict[str, Any]:
    by_key, by_email = secret_ids(s)
    memory = build_memory(
        {
            "content": s.text,
            "tenant": TENANT,
            "tags": [by_key],
            "session_id": by_key,
            "agent_id": by_email,
            "task_id": by_key,
            "tool_name": by_key,
            "team_id": by_email,
            "metadata": _metadata(s),
        }
    )
    return memory.model_dump(mode="json")


def _checkpoint_name(s: Secrets) -> str:
    """The three secrets in a checkpoint name, which is one line: the key block with spaces for breaks."""
    return f"before {s.aws} {s.email} {s.pem.replace(chr(10), ' ')}"


def _sdk_checkpoint(h: Harness, s: Secrets) -> None:
    h.record("a step of the checkpointed session", session_id="cp-session")
    h.checkpoint("cp-session", _checkpoint_name(s))


def _rest_checkpoint(rest: Rest, s: Secrets) -> None:
    rest.call(
        "POST", "/v1/memories", {"content": "a step of the checkpointed session", "session_id": "cp-rest"}
    )
    rest.call("POST", "/v1/sessions/cp-rest/checkpoints", {"name": _checkpoint_name(s)})


def _sdk_annotation(h: Harness, s: Secrets) -> None:
    m = h.record("a note a dashboard user annotates")
    learning.intervene(h, "annotate", m.id, note=s.text, by="dashboard")


def _rest_annotation(rest: Rest, s: Secrets) -> None:
    m = rest.call("POST", "/v1/memories", {"content": "a note a dashboard user annotates"})
    rest.call("POST", f"/dashboard/api/memories/{m['id']}/annotate", {"text": s.text})


@dataclass(frozen=True)
class Field:
    sdk: Callable[[Harness, Secrets], None]
    rest: Callable[[Rest, Secrets], None] | None  # None: REST has no way to set it but import


def _sdk_record(
    content: str, fields: Callable[[Secrets], dict[str, Any]]
) -> Callable[[Harness, Secrets], None]:
    def plant(h: Harness, s: Secrets) -> None:
        h.record(content or s.text, **fields(s))

    return plant


def _rest_record(
    content: str, fields: Callable[[Secrets], dict[str, Any]]
) -> Callable[[Rest, Secrets], None]:
    def plant(rest: Rest, s: Secrets) -> None:
        rest.call("POST", "/v1/memories", {"content": content or s.text, **fields(s)})

    return plant


def _sdk_start(h: Harness, s: Secrets) -> None:
    h.start_session("start-session", s.text)


def _rest_start(rest: Rest, s: Secrets) -> None:
    rest.call("POST", "/v1/sessions/start-rest/start", {"task": s.text})


def _sdk_import(h: Harness, s: Secrets) -> None:
    assert h.import_memories([build_memory(_imported(s))]) == 1


def _rest_import(rest: Rest, s: Secrets) -> None:
    assert (
        rest.call("POST", "/v1/memories/import", {"memories": [_imported(s)]}, who="admin")["imported"] == 1
    )


def _nothing(s: Secrets) -> dict[str, Any]:
    return {}


def _tags(s: Secrets) -> dict[str, Any]:
    return {"tags": list(secret_ids(s))}


def _with_metadata(s: Secrets) -> dict[str, Any]:
    return {"metadata": _metadata(s)}


FIELDS: dict[str, Field] = {
    "content": Field(_sdk_record("", _nothing), _rest_record("", _nothing)),
    "tags": Field(_sdk_record("a tagged note", _tags), _rest_record("a tagged note", _tags)),
    "metadata": Field(
        _sdk_record("a note with metadata", _with_metadata),
        _rest_record("a note with metadata", _with_metadata),
    ),
    **{
        name: Field(_sdk_scope(name), _rest_scope(name))
        for name in ("session_id", "agent_id", "task_id", "tool_name")
    },
    "team_id": Field(_sdk_scope("team_id"), None),
    "checkpoint_name": Field(_sdk_checkpoint, _rest_checkpoint),
    "session_start_task": Field(_sdk_start, _rest_start),
    "annotation": Field(_sdk_annotation, _rest_annotation),
    "import": Field(_sdk_import, _rest_import),
}
SURFACES = ("sdk", "rest")
PLANTED = [(f, surface) for f in FIELDS for surface in SURFACES if surface == "sdk" or FIELDS[f].rest]


def test_the_planted_secrets_are_what_the_detectors_catch() -> None:
    """Otherwise every test below would pass for the wrong reason."""
    for field, surface in PLANTED:
        s = Secrets.of(field, surface)
        assert redact(s.text).counts() == {"secret": 2, "email": 1}, s.text
        assert not s.leaks(redact(s.text).text)
        for value in secret_ids(s):
            assert not s.leaks(redact_identifier(value, salt=TENANT))


# ---- one server over one SQLite file, every field planted through both surfaces ----------------------------
@dataclass
class World:
    db: Path
    store: Store
    rest: Rest
    sdk: Harness


def _options() -> dict[str, Any]:
    """What ``clawvm serve --keep-originals`` gives its tenants: every kind redacted, originals sealed."""
    return redaction_options(keep_originals=True, environ={KEY_ENV: DataKey.generate().encode()})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    db = tmp_path_factory.mktemp("redact-fields") / "server.db"
    options = _options()
    store = SQLiteStore(db)
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), harness_options=options)
    ring = app.state.service.keyring
    keys = {role: ring.create(TENANT, role, role)[1] for role in ("admin", "agent", "read-only")}
    # the SDK: a harness of its own on the same file, as another process of the deployment would open it
    sdk = Harness.open(db, embedder=None, tenant=TENANT, **options)
    with TestClient(app) as client:
        rest = Rest(client, keys)
        for field, surface in PLANTED:
            s = Secrets.of(field, surface)
            if surface == "sdk":
                FIELDS[field].sdk(sdk, s)
            else:
                plant = FIELDS[field].rest
                assert plant is not None
                plant(rest, s)
        _read_everything(rest, store)
        yield World(db, store, rest, sdk)
    sdk.close()
    store.close()


def _read_everything(rest: Rest, store: Store) -> None:
    """Every non-admin read of the REST API and the dashboard, by an agent key and a read-only key."""
    ids = [m.id for m in store.iter_all()]
    statuses = [s for s in ("active", "archived", "obsolete", "expired")]
    for who in ("agent", "read-only"):
        rest.call("GET", "/v1/memories", who=who, limit=1000, status=statuses)
        for memory_id in ids:
            rest.call("GET", f"/v1/memories/{memory_id}", who=who)
            rest.call("GET", f"/dashboard/api/memories/{memory_id}", who=who)
            rest.call("GET", f"/dashboard/api/memories/{memory_id}/contexts", who=who)
        for query in ("note", "deploy key ask", "scoped note", "session"):
            rest.call("POST", "/v1/recall", {"query": query, "k": 50}, who=who)
            rest.call("POST", "/v1/context", {"query": query, "budget_tokens": 4000}, who=who)
        after = 0
        while page := rest.call("GET", "/v1/events", who=who, after_seq=after, limit=1000)["events"]:
            after = page[-1]["seq"]
        rest.call("GET", "/v1/export", who=who)
        rest.call("GET", "/v1/stats", who=who)
        for view in ("overview", "sessions", "timeline", "heatmap", "graph", "contexts", "metrics"):
            rest.call("GET", f"/dashboard/api/{view}", who=who)
        for view in ("weights", "manual"):
            rest.call("GET", f"/dashboard/api/{view}", who=who)
        rest.call("GET", "/dashboard/api/memories", who=who, limit=500)
        # the debugging views: traces, exact prompts, revisions, teams, the selection's export
        for fmt in ("jsonl", "csv"):
            rest.call("GET", "/dashboard/api/export", who=who, format=fmt)
        rest.call("GET", "/dashboard/api/teams", who=who)
        for build in rest.call("GET", "/dashboard/api/contexts", who=who, limit=500)["items"]:
            rest.call("GET", f"/dashboard/api/contexts/{build['seq']}", who=who)
        for session in {m.session_id for m in store.iter_all() if m.session_id}:
            rest.call("GET", "/dashboard/api/trace", who=who, session=session)
        for memory_id in ids[:20]:
            rest.call("GET", f"/dashboard/api/memories/{memory_id}/revisions", who=who)


# ---- 1. what rests on disk ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("field", "surface"), PLANTED)
def test_the_sqlite_file_and_its_wal_hold_no_planted_secret(world: World, field: str, surface: str) -> None:
    s = Secrets.of(field, surface)
    for path in (world.db, world.db.with_name(world.db.name + "-wal")):
        raw = path.read_bytes() if path.exists() else b""
        assert not s.leaks(raw), f"{path.name} holds the {s.leaks(raw)} planted in {field} via {surface}"


def _rows_as_text(store: Store) -> str:
    """Every memory (every field) and every event of the engine, as JSON text."""
    parts = [m.model_dump_json() for m in store.iter_all(Filters())]
    after = 0
    while page := store.read_events(after, 1000):
        parts += [json.dumps({"kind": e.kind, "memory_id": e.memory_id, "data": e.data}) for e in page]
        after = page[-1].seq or after
    return "\n".join(parts)


def _postgres_tables_as_text(url: str) -> str:
    """Every row of every table of the store's schema, as PostgreSQL prints the row."""
    parts_of_url = urlparse(url)
    query = parse_qs(parts_of_url.query)
    [schema] = query.pop("schema")
    server = urlunparse(parts_of_url._replace(query=urlencode(query, doseq=True)))
    parts: list[str] = []
    with psycopg.connect(server) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        assert tables, f"no tables in schema {schema}"
        for (table,) in tables:
            rows = conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall()
            parts += [row[0] for row in rows]
    return "\n".join(parts)


@pytest.fixture(scope="module", params=["memory", "postgres"])
def engine_rows(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The raw rows and events of an engine after every field was planted through the SDK."""
    target = harness_target(request.param, tmp_path_factory.mktemp(request.param), "fields.db")
    with Harness.open(target, embedder=None, tenant=TENANT, **_options()) as h:
        for field in FIELDS:
            FIELDS[field].sdk(h, Secrets.of(field, "sdk"))
        text = _rows_as_text(h.store)
        if request.param == "postgres":
            text += "\n" + _postgres_tables_as_text(target)
    return text


@pytest.mark.parametrize("field", list(FIELDS))
def test_engine_rows_and_events_hold_no_planted_secret(engine_rows: str, field: str) -> None:
    s = Secrets.of(field, "sdk")
    assert not s.leaks(engine_rows), f"the engine's rows hold the {s.leaks(engine_rows)} planted in {field}"


# ---- 2. what non-admin callers are shown -------------------------------------------------------------------
@pytest.mark.parametrize(("field", "surface"), PLANTED)
def test_no_non_admin_response_holds_a_planted_secret(world: World, field: str, surface: str) -> None:
    s = Secrets.of(field, surface)
    leaks = [f"{what} shows the {found}" for what, body in world.rest.seen if (found := s.leaks(body))]
    assert not leaks, f"planted in {field} via {surface}:\n  " + "\n  ".join(leaks[:10])


def test_no_non_admin_response_carries_a_sealed_envelope(world: World) -> None:
    envelopes = [e for m in world.store.iter_all(Filters()) if (e := sealed_envelope(m)) is not None]
    assert len(envelopes) >= 4, "originals were to be sealed: the check below would prove nothing"
    views = {what.split(" as ")[0].split("/")[1] for what, _ in world.rest.seen}
    assert {"v1", "dashboard"} <= views and len(world.rest.seen) > 100
    for what, body in world.rest.seen:
        assert '"sealed"' not in body, f"{what} carries a sealed envelope"
        for envelope in envelopes:
            assert envelope["ct"] not in body and envelope["nonce"] not in body, f"{what} shows a ciphertext"


def test_an_admin_still_reveals_the_original(world: World) -> None:
    planted = {Secrets.of(field, surface).text for field in ("content", "import") for surface in SURFACES}
    redacted = [m for m in world.store.iter_all(Filters()) if m.content.startswith("deploy with [SECRET]")]
    assert len(redacted) == len(planted)
    revealed = {
        world.rest.call("GET", f"/v1/memories/{m.id}/original", who="admin")["content"] for m in redacted
    }
    assert revealed == planted
    exported = world.rest.call("GET", "/v1/export", who="admin")
    assert '"sealed"' in exported  # an admin's export is the backup an import takes whole


# ---- scope ids are identifiers -----------------------------------------------------------------------------
@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("name", ["session_id", "agent_id", "task_id", "tool_name"])
def test_a_secret_looking_scope_id_keeps_its_memories_together_and_apart(
    world: World, name: str, surface: str
) -> None:
    by_key, by_email = secret_ids(Secrets.of(name, surface))
    mine = [m for m in world.store.iter_all(Filters()) if m.content.startswith("scoped note ")]
    mine = [m for m in mine if m.content.endswith(f" of {name}")]
    stored = [getattr(m, name) for m in mine]
    # two surfaces planted three each: one id twice, the other once, per surface
    assert len(mine) == 6 and len(set(stored)) == 4, stored
    for raw in (by_key, by_email):
        if surface == "sdk":
            found = world.sdk.list(limit=10, **{name: raw})
        else:
            found = world.rest.call("GET", "/v1/memories", who="read-only", limit=10, **{name: raw})
        assert len(found) == (2 if raw == by_key else 1), (name, surface, raw)


def test_the_stored_form_of_an_id_is_its_own_stored_form() -> None:
    """Readers map the ids they filter by: a stored id mapped again must not move."""
    policy = RedactionPolicy()
    for field, surface in PLANTED:
        for value in secret_ids(Secrets.of(field, surface)):
            stored = redact_identifier(value, policy, salt=TENANT)
            assert stored != value and redact_identifier(stored, policy, salt=TENANT) == stored
            assert redact_identifier(value, policy, salt="other") != stored  # tenants do not correlate
    assert redact_identifier("session-42", policy, salt=TENANT) == "session-42"


def test_a_card_or_phone_number_given_as_a_number_in_metadata_is_redacted_as_in_content() -> None:
    """Metadata numbers were left as they were: a card number sent as an integer was stored in clear,
    though the same value in JSON content became [CARD]."""
    with Harness.open("memory://", embedder=None, redaction=RedactionPolicy()) as h:
        in_content = h.record({"card": 4111111111111111})
        in_metadata = h.record(
            "payment note", metadata={"card": 4111111111111111, "billing": {"phone": 5550132}, "count": 7}
        )
        assert json.loads(in_content.content) == {"card": "[CARD]"}
        assert in_metadata.metadata["card"] == "[CARD]" and in_metadata.metadata["count"] == 7
        assert in_metadata.metadata["billing"] == {"phone": "[PHONE]"}
        assert h.get(in_metadata.id).metadata == in_metadata.metadata  # as stored


def test_secrets_glued_to_cjk_text_are_redacted_in_every_field() -> None:
    """Chinese and Japanese put no space before a value: "密钥AKIA..." was stored in clear in content,
    metadata, tags and ids, since a CJK letter counted as part of the word (no boundary before the key)."""
    s = Secrets.of("cjk", "sdk")
    glued = f"密钥{s.aws}，邮箱{s.email}です"
    with Harness.open("memory://", embedder=None, redaction=RedactionPolicy()) as h:
        m = h.record(
            glued, metadata={"备注": glued, "nested": [f"卡号4111111111111111，{s.aws}"]}, tags=[glued]
        )
        task = h.record("task note", session_id=f"会话{s.aws}", task_id=f"任务{s.email}")
        assert m.content == "密钥[SECRET]，邮箱[EMAIL]です"
        assert m.metadata["备注"] == m.content and m.metadata["nested"] == ["卡号[CARD]，[SECRET]"]
        for memory in (h.get(m.id), h.get(task.id)):  # as stored: content, metadata, tags and scope ids
            assert not s.leaks(repr(memory)), memory


def test_grants_of_secret_looking_team_and_agent_ids_govern_their_memories(tmp_path: Path) -> None:
    """Grants are kept and checked in the stored form of the ids, like the memories they govern."""
    s = Secrets.of("grants", "sdk")
    team, agent = secret_ids(s)
    with Harness.open(tmp_path / "teams.db", embedder=None, tenant=TENANT, **_options()) as h:
        with pytest.raises(AccessDeniedError):
            teams.record(h, "before any grant", agent_id=agent, team_id=team)
        h.grant(team, agent, write=True)
        made = teams.record(h, "the deploy needs the staging key", agent_id=agent, team_id=team)
        assert not s.leaks(made.model_dump_json())
        changed = h.update(made.id, as_agent=agent, content="the deploy needs the new staging key")
        assert changed.team_id == made.team_id != team
        seen = h.list(visible_to=teams.visibility(h, agent), team_id=team)
        assert [m.id for m in seen] == [made.id]
        assert [g.agent_id for g in teams.grants(h, team)] == [made.agent_id]
        assert not s.leaks(_rows_as_text(h.store))


def test_a_secret_looking_session_checkpoints_rolls_back_and_builds_its_context() -> None:
    """Every operation naming the session by the id it was recorded with finds its memories."""
    s = Secrets.of("session-ops", "sdk")
    session, _ = secret_ids(s)
    with Harness.open("memory://", embedder=None, tenant=TENANT, **_options()) as h:
        first = h.record("first step of the rollout", session_id=session)
        checkpoint = h.checkpoint(session, "before the second step")
        later = h.record("second step of the rollout", session_id=session)
        assert h.rollback(checkpoint).obsoleted == [later.id]
        ctx = h.context("", session_id=session)
        assert [e.id for e in ctx.manifest] == [first.id]  # the session's working tier, found by its id
        assert [m.id for m in h.list(session_id=session)] == [first.id]
        assert not s.leaks(_rows_as_text(h.store))


def test_the_dashboard_traces_and_replays_a_session_by_the_id_it_was_recorded_with(tmp_path: Path) -> None:
    """The trace, metrics and what-if compared the typed id with the stored, redacted one and answered 404
    (the memories view and every SDK read mapped it)."""
    s = Secrets.of("dashboard-session", "rest")
    session, _ = secret_ids(s)
    store = SQLiteStore(tmp_path / "dash.db")
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), harness_options=_options())
    key = app.state.service.keyring.create(TENANT, "agent", "agent")[1]
    with TestClient(app) as client:
        rest = Rest(client, {"agent": key})
        rest.call("POST", "/v1/memories", {"content": "the rollout starts at noon", "session_id": session})
        rest.call("POST", "/v1/context", {"query": "rollout", "session_id": session, "budget_tokens": 200})
        trace = rest.call("GET", "/dashboard/api/trace", session=session)
        assert trace["steps"] or trace.get("items")
        assert rest.call("GET", "/dashboard/api/metrics", session=session)["memories"]
        rest.call("GET", "/dashboard/api/whatif", session=session, budget=100)
    store.close()


# ---- what a security probe found stored in clear -----------------------------------------------------------
PROBE_SECRETS = {
    "pg env": ("export PGPASSWORD=hunter2pg", "hunter2pg"),
    "mysql env": ("MYSQL_PWD=hunter2my", "hunter2my"),
    "quoted phrase": ("password: 'my pass phrase 7'", "pass phrase 7"),
    "double-quoted phrase": ('password="hunter 2 with spaces"', "2 with spaces"),
    "card, no-break spaces": ("card 4111\u00a01111\u00a01111\u00a01111", "1111\u00a01111"),
    "card, narrow no-break spaces": ("card 5555\u202f5555\u202f5555\u202f4444", "5555\u202f5555"),
    "card, dots": ("card 4012.8888.8888.1881", "8888.8888"),
    "email, zero-width space": ("mail bob\u200b@example.com", "@example.com"),
    "mysql -p": ("mysql -u root -phunter2mysql shop", "hunter2mysql"),
}


def test_the_probe_s_secrets_are_stored_redacted_through_the_server(tmp_path: Path) -> None:
    """Written through REST as ``clawvm serve`` runs (every kind redacted, originals sealed): in content,
    in metadata values, and as the values of metadata keys that name a password ("pass", "pw")."""
    db = tmp_path / "probe.db"
    store = SQLiteStore(db)
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), harness_options=_options())
    agent = app.state.service.keyring.create(TENANT, "agent", "agent")[1]
    shown: list[str] = []
    with TestClient(app) as client:

        def post(body: dict[str, Any]) -> None:
            r = client.post("/v1/memories", json=body, headers={"Authorization": f"Bearer {agent}"})
            assert r.is_success, r.text
            shown.append(r.text)

        for what, (text, _) in PROBE_SECRETS.items():
            post({"content": f"{what}: {text}", "metadata": {"note": text}})
        post({"content": "login", "metadata": {"pass": "hunter2meta", "db": {"pw": "hunter2nested"}}})
        r = client.get("/v1/memories", headers={"Authorization": f"Bearer {agent}"})
        shown.append(r.text)
    telltales = [telltale for _, telltale in PROBE_SECRETS.values()] + ["hunter2meta", "hunter2nested"]
    raw = b"".join(p.read_bytes() for p in (db, db.with_name(db.name + "-wal")) if p.exists())
    for telltale in telltales:
        assert telltale.encode() not in raw, f"{telltale!r} rests in the SQLite file"
        for body in shown:  # as sent, and with the JSON escapes of non-ASCII characters read back
            assert telltale not in body and telltale not in json.dumps(json.loads(body), ensure_ascii=False)
    stored = {m.content: m for m in store.iter_all(Filters())}
    assert stored["login"].metadata["pass"] == "[SECRET]"
    assert stored["login"].metadata["db"] == {"pw": "[SECRET]"}
