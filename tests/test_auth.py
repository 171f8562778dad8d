"""API keys: stored hashed in the store's credentials table (never the event log, which retention prunes),
one tenant and one role each, revocable and rotatable anywhere; older stores' key events migrate on open."""

from __future__ import annotations

import hashlib
import importlib
import json
import secrets
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm.cli import keys, main
from clawvm.core.errors import AccessDeniedError, AuthenticationError, NotFoundError, ValidationError
from clawvm.store import Credential, Event, SQLiteStore, Store
from clawvm.store.eventlog import Retention, prune
from clawvm.store.keys import (
    API_KEY,
    AUDIT_CREATED,
    AUDIT_REVOKED,
    AUTH_TENANT,
    KEYS_STREAM,
    LEGACY_CREATED,
    LEGACY_REVOKED,
    PERMISSIONS,
    Keyring,
    Permission,
    Principal,
    Role,
    check_tenant_name,
    digest,
)
from clawvm.store.tenant import TenantStore
from engines import harness_target, make_store


def test_a_key_authenticates_as_its_tenant_and_role(engine: Store) -> None:
    ring = Keyring(engine)
    record, token = ring.create("acme", "agent", "deploy bot")
    assert token.startswith(f"cvm_{record.key_id}_") and len(token) > 50
    assert ring.authenticate(token) == Principal(record.key_id, "acme", Role.AGENT)
    assert record.hash == hashlib.sha256(token.encode()).hexdigest()


def test_only_the_hash_is_stored_and_only_as_a_credential(engine: Store) -> None:
    ring = Keyring(engine)
    record, token = ring.create("acme", "admin")
    secret, hashed = token.split("_", 2)[2], hashlib.sha256(token.encode()).hexdigest()
    stored = json.dumps([c.data for c in engine.list_credentials()])
    assert secret not in stored and hashed in stored
    logged = json.dumps([e.data for e in engine.read_events(0, 1000)])
    assert secret not in logged and hashed not in logged and record.key_id in logged  # the audit line


def test_a_keys_audit_lines_carry_its_name_scrubbed(engine: Store) -> None:
    """The log is exported and streamed: an operator's label naming a person stays in the key list."""
    ring = Keyring(engine)
    record, _ = ring.create("acme", "agent", "ci runner of ann@example.org")
    ring.revoke(record.key_id)
    audits = [e.data["name"] for e in engine.read_events(0, 1000) if e.data.get("key_id") == record.key_id]
    assert audits == ["ci runner of [EMAIL]", "ci runner of [EMAIL]"]
    assert [k.name for k in ring.list("acme", include_revoked=True)] == ["ci runner of ann@example.org"]


def test_the_raw_sqlite_file_holds_no_key(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "k.db")
    store.setup()
    _, token = Keyring(store).create("acme", "admin")
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert token.split("_", 2)[2].encode() not in raw


@pytest.mark.parametrize(
    "token",
    ["", "cvm_", "Bearer x", "cvm_0123456789ab_short", "cvm_zzzzzzzzzzzz_" + "a" * 43, "x" * 5000],
)
def test_malformed_or_missing_keys_are_refused(engine: Store, token: str) -> None:
    with pytest.raises(AuthenticationError):
        Keyring(engine).authenticate(token or None)


def test_a_wrong_secret_for_a_real_key_id_is_refused(engine: Store) -> None:
    ring = Keyring(engine)
    record, token = ring.create("acme", "agent")
    forged = f"cvm_{record.key_id}_" + ("A" * 43 if not token.endswith("A" * 43) else "B" * 43)
    with pytest.raises(AuthenticationError, match="unknown"):
        ring.authenticate(forged)


def test_revoked_keys_stop_working_in_every_process(engine: Store) -> None:
    now = [0.0]
    server = Keyring(engine, refresh_s=2.0, clock=lambda: now[0])
    cli = Keyring(engine)  # another process on the same store
    record, token = cli.create("acme", "agent")
    assert server.authenticate(token).tenant == "acme"  # an unknown key id makes it re-read the log
    cli.revoke(record.key_id)
    assert server.authenticate(token).tenant == "acme"  # still cached: within refresh_s
    now[0] += 2.5
    with pytest.raises(AuthenticationError, match="revoked"):
        server.authenticate(token)
    assert cli.revoke(record.key_id).revoked_at is not None  # revoking twice is harmless


def test_needs_lookup_says_when_authenticate_would_read_the_store(engine: Store) -> None:
    # the server authenticates on its event loop when this is False, in a thread when True
    now = [0.0]
    server = Keyring(engine, refresh_s=2.0, clock=lambda: now[0])
    _, token = Keyring(engine).create("acme", "agent")  # made by another process: not cached here
    assert server.needs_lookup(token)
    server.authenticate(token)
    assert not server.needs_lookup(token)  # read and cached
    now[0] += 2.5
    assert server.needs_lookup(token)  # cached too long ago: re-read (a revocation elsewhere shows)
    server.authenticate(token)
    assert not server.needs_lookup(token)
    for unread in (None, "", "not a key", "cvm_0123456789ab_short"):  # refused without a lookup
        assert not server.needs_lookup(unread)


def test_an_open_stream_sees_a_revocation_within_refresh_s_without_reading_the_log_each_time(
    engine: Store,
) -> None:
    now = [0.0]
    server = Keyring(engine, refresh_s=2.0, clock=lambda: now[0])
    cli = Keyring(engine)  # another process on the same store
    record, token = cli.create("acme", "agent")
    server.authenticate(token)
    cli.revoke(record.key_id)
    assert server.active(record.key_id)  # within refresh_s: the cached key
    now[0] += 2.5
    assert not server.active(record.key_id)
    assert not server.active("no-such-key")
    own, _ = server.create("acme", "agent")
    server.revoke(own.key_id)  # a revocation through this keyring counts at once
    assert not server.active(own.key_id)


def test_listing_and_revoking_are_scoped_to_a_tenant(engine: Store) -> None:
    ring = Keyring(engine)
    a1, _ = ring.create("acme", "admin")
    a2, _ = ring.create("acme", "read-only")
    g1, _ = ring.create("globex", "agent")
    assert [k.key_id for k in ring.list("acme")] == [a1.key_id, a2.key_id]
    assert {k.key_id for k in ring.list()} == {a1.key_id, a2.key_id, g1.key_id}
    with pytest.raises(NotFoundError):
        ring.revoke(g1.key_id, tenant="acme")
    ring.revoke(a2.key_id, tenant="acme")
    assert [k.key_id for k in ring.list("acme")] == [a1.key_id]
    assert len(ring.list("acme", include_revoked=True)) == 2


def test_key_events_are_invisible_to_tenants(engine: Store) -> None:
    ring = Keyring(engine)
    ring.create("acme", "admin")
    assert TenantStore(engine, "acme").read_events(0, 100) == []
    assert all(e.tenant == AUTH_TENANT for e in engine.read_events(0, 100, KEYS_STREAM))


def test_no_event_makes_a_key(engine: Store) -> None:
    token = f"cvm_0123456789ab_{secrets.token_urlsafe(32)}"
    fake = {"key_id": "0123456789ab", "tenant": "acme", "role": "admin", "name": "", "hash": digest(token)}
    for tenant in ("acme", AUTH_TENANT):  # not even the old format, in the reserved tenant's stream
        engine.append_event(Event(kind=LEGACY_CREATED, memory_id=KEYS_STREAM, tenant=tenant, data=fake))
    ring = Keyring(engine)
    assert ring.list() == []
    with pytest.raises(AuthenticationError, match="unknown"):
        ring.authenticate(token)


# ---- keys are credentials, not events: retention never reaches them ---------------------------------
def _prune_everything(store: Store) -> int:
    """What ``clawvm prune-events --max-events 0`` runs."""
    return prune(store, Retention(max_events=0), datetime.now(UTC))


def test_every_key_still_authenticates_after_every_event_is_pruned(engine: Store) -> None:
    ring = Keyring(engine)
    made = {(t, role): ring.create(t, role, f"{t} {role.value}") for t in ("acme", "globex") for role in Role}
    gone, gone_token = ring.create("acme", "agent", "to revoke")
    ring.revoke(gone.key_id)
    old, old_token = ring.create("globex", "admin", "to rotate")
    new, new_token = ring.rotate(old.key_id)
    engine.append_events([Event(kind="add", memory_id=f"m{i}", tenant="acme") for i in range(3)])
    # the adds, and the audit lines: a create per key, a revocation per revoked key (the rotated one too)
    assert _prune_everything(engine) == 3 + len(made) + 3 + 2
    notes = {e.tenant: e.data["deleted"] for e in engine.read_events(0, 10)}  # a note per tenant: its share
    assert notes == {"acme": 3, "_auth": len(made) + 3 + 2}
    fresh = Keyring(engine)  # another process, started after the prune: nothing cached
    for (tenant, role), (record, token) in made.items():
        assert fresh.authenticate(token) == Principal(record.key_id, tenant, role)
    assert fresh.authenticate(new_token) == Principal(new.key_id, "globex", Role.ADMIN)
    for revoked in (gone_token, old_token):
        with pytest.raises(AuthenticationError, match="revoked"):
            fresh.authenticate(revoked)
    assert {k.key_id for k in fresh.list()} == {r.key_id for r, _ in made.values()} | {new.key_id}
    assert len(fresh.list(include_revoked=True)) == len(made) + 3


def test_revoking_and_rotating_still_work_after_a_prune(engine: Store) -> None:
    ring = Keyring(engine)
    doomed, doomed_token = ring.create("acme", "agent")
    ops, ops_token = ring.create("acme", "admin", "ops")
    _prune_everything(engine)
    other = Keyring(engine)
    assert other.revoke(doomed.key_id, tenant="acme").revoked_at is not None
    rotated, rotated_token = other.rotate(ops.key_id, tenant="acme")
    assert (rotated.tenant, rotated.role, rotated.name) == ("acme", Role.ADMIN, "ops")
    assert rotated.key_id != ops.key_id
    kinds = [e.kind for e in engine.read_events(0, 10, KEYS_STREAM)]
    assert kinds == [AUDIT_REVOKED, AUDIT_CREATED, AUDIT_REVOKED]  # the audit trail goes on
    _prune_everything(engine)  # and may go again: nothing reads it
    fresh = Keyring(engine)
    for token in (doomed_token, ops_token):
        with pytest.raises(AuthenticationError, match="revoked"):
            fresh.authenticate(token)
    assert fresh.authenticate(rotated_token) == Principal(rotated.key_id, "acme", Role.ADMIN)


def test_a_revoked_key_stays_revoked_after_a_prune_in_a_server_that_had_cached_it(engine: Store) -> None:
    now = [0.0]
    server = Keyring(engine, refresh_s=2.0, clock=lambda: now[0])
    cli = Keyring(engine)
    record, token = cli.create("acme", "agent")
    assert server.authenticate(token).key_id == record.key_id  # cached
    cli.revoke(record.key_id)
    _prune_everything(engine)  # the revocation's audit line is gone
    now[0] += 2.5
    with pytest.raises(AuthenticationError, match="revoked"):
        server.authenticate(token)
    assert not server.active(record.key_id)
    assert engine.get_credential("acme", API_KEY, record.key_id) is not None
    assert [k.key_id for k in Keyring(engine).list(include_revoked=True) if not k.active] == [record.key_id]


def test_rotating_needs_an_active_key_of_the_callers_tenant(engine: Store) -> None:
    ring = Keyring(engine)
    globex, globex_token = ring.create("globex", "admin")
    gone, _ = ring.create("acme", "agent")
    ring.revoke(gone.key_id)
    with pytest.raises(NotFoundError):
        ring.rotate(globex.key_id, tenant="acme")
    with pytest.raises(NotFoundError):
        ring.rotate("0123456789ab")
    with pytest.raises(ValidationError, match="revoked"):
        ring.rotate(gone.key_id)
    assert ring.authenticate(globex_token).tenant == "globex"  # untouched
    assert len(ring.list(include_revoked=True)) == 2


def test_concurrent_revocations_revoke_once(engine: Store) -> None:
    record, _ = Keyring(engine).create("acme", "agent")
    results = []
    start = threading.Barrier(6)

    def revoke() -> None:
        ring = Keyring(engine)  # one process each
        start.wait()
        results.append(ring.revoke(record.key_id))

    threads = [threading.Thread(target=revoke) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = engine.get_credential("acme", API_KEY, record.key_id)
    assert stored is not None and stored.version == 2
    assert {r.revoked_at for r in results} == {datetime.fromisoformat(stored.data["revoked_at"])}
    assert [e.kind for e in engine.read_events(0, 100, KEYS_STREAM)].count(AUDIT_REVOKED) == 1


@pytest.mark.engines("sqlite", "postgres")
def test_prune_events_on_the_command_line_keeps_every_key(engine_name: str, tmp_path: Path) -> None:
    db = harness_target(engine_name, tmp_path, "cli.db")
    runner = CliRunner()

    def cli(*args: str) -> str:
        done = runner.invoke(main, ["--db", db, *args], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return done.stdout

    kept = cli("keys", "create", "--tenant", "acme", "--role", "admin").strip()
    doomed = cli("keys", "create", "--tenant", "acme", "--role", "agent").strip()
    rotated = cli("keys", "create", "--tenant", "globex", "--role", "read-only", "--name", "bot").strip()
    cli("keys", "revoke", doomed.split("_")[1])
    successor = cli("keys", "rotate", rotated.split("_")[1]).strip()
    assert cli("prune-events", "--max-events", "0") == "deleted 6 events\n"  # 4 creates, 2 revocations
    store = make_store(engine_name, tmp_path, "cli.db")
    store.setup()
    try:
        assert {e.kind for e in store.read_events(0, 10)} == {"events_pruned"}
        ring = Keyring(store)
        assert (ring.authenticate(kept).tenant, ring.authenticate(kept).role) == ("acme", Role.ADMIN)
        assert ring.authenticate(successor) == Principal(successor.split("_")[1], "globex", Role.READ_ONLY)
        for token in (doomed, rotated):
            with pytest.raises(AuthenticationError, match="revoked"):
                ring.authenticate(token)
    finally:
        store.close()
    listed = [json.loads(line) for line in cli("keys", "list", "--json").splitlines()]
    assert sorted((k["tenant"], k["role"], k["name"]) for k in listed) == [
        ("acme", "admin", ""),
        ("globex", "read-only", "bot"),
    ]


# ---- stores made before the credentials table: their key events migrate on open, once ----------------
def _engine_module(engine_name: str) -> ModuleType:
    return importlib.import_module(f"clawvm.store.{engine_name}")


def _old_append(engine_name: str, store: Store) -> Callable[..., list[int]]:
    """``store.append_events`` as an engine of that older schema ran it: its events table had only these
    columns (no per-tenant numbers yet)."""
    columns = "INSERT INTO events (at, tenant, kind, memory_id, data)"

    def append(events: Sequence[Event], **_: Any) -> list[int]:
        rows = [(e.at, e.tenant, e.kind, e.memory_id, json.dumps(e.data)) for e in events]
        if isinstance(store, SQLiteStore):
            with store._write("old append") as (db, _rev, _counted):
                return [
                    db.execute(f"{columns} VALUES (?,?,?,?,?)", (at.isoformat(), *r)).lastrowid or 0
                    for at, *r in rows
                ]
        from clawvm.store.postgres import PostgresStore

        assert engine_name == "postgres" and isinstance(store, PostgresStore)
        with store._conn("old append") as conn:
            return [
                int(conn.execute(f"{columns} VALUES (%s,%s,%s,%s,%s) RETURNING seq", r).fetchone()[0])
                for r in rows
            ]

    return append


def _legacy_key(
    store: Store,
    tenant: str,
    role: str,
    name: str = "",
    *,
    at: datetime | None = None,
    logged_by: str = AUTH_TENANT,
    stream: str = KEYS_STREAM,
) -> tuple[str, str]:
    """Log a key as stores before the credentials table did (its only record was this event)."""
    key_id = secrets.token_hex(6)
    token = f"cvm_{key_id}_{secrets.token_urlsafe(32)}"
    data = {"key_id": key_id, "tenant": tenant, "role": role, "name": name, "hash": digest(token)}
    store.append_event(Event(LEGACY_CREATED, stream, data, logged_by, at=at or datetime.now(UTC)))
    return key_id, token


@pytest.mark.engines("sqlite", "postgres")
def test_a_store_whose_keys_exist_only_as_events_is_migrated_on_open(
    engine_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _engine_module(engine_name)
    migrations = module.MIGRATIONS
    adds_table = next(n for n, sql in enumerate(migrations) if "CREATE TABLE credentials" in sql)
    created = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    with monkeypatch.context() as patch:  # the schema as it was before the credentials table
        patch.setattr(module, "MIGRATIONS", migrations[:adds_table])
        old = make_store(engine_name, tmp_path, "old.db")
        old.setup()
        patch.setattr(old, "append_events", _old_append(engine_name, old))
        ops_id, ops = _legacy_key(old, "acme", "admin", "ops", at=created)
        bot_id, bot = _legacy_key(old, "globex", "agent", "bot", at=created + timedelta(days=1))
        gone_id, gone = _legacy_key(old, "acme", "read-only", at=created + timedelta(hours=1))
        revoked_at = created + timedelta(days=2)
        for key_id in (gone_id, gone_id, "0123456789ab"):  # twice, and a key that never existed
            old.append_event(
                Event(LEGACY_REVOKED, KEYS_STREAM, {"key_id": key_id}, AUTH_TENANT, at=revoked_at)
            )
        _, forged = _legacy_key(old, "acme", "admin", logged_by="acme")  # by a tenant: never counted
        _, elsewhere = _legacy_key(old, "acme", "admin", stream="another-stream")
        old.append_event(Event(LEGACY_CREATED, KEYS_STREAM, {"key_id": "abc", "tenant": "acme"}, AUTH_TENANT))
        old.append_events([Event(kind="add", memory_id=f"m{i}", tenant="acme") for i in range(3)])
        old.close()
    store = make_store(engine_name, tmp_path, "old.db")
    store.setup()  # the current schema: creates the credentials table and copies the keys in
    try:
        ring = Keyring(store)
        keys = ring.list(include_revoked=True)
        assert [(k.key_id, k.tenant, k.role, k.name, k.created_at, k.revoked_at) for k in keys] == [
            (ops_id, "acme", Role.ADMIN, "ops", created, None),
            (gone_id, "acme", Role.READ_ONLY, "", created + timedelta(hours=1), revoked_at),
            (bot_id, "globex", Role.AGENT, "bot", created + timedelta(days=1), None),
        ]
        assert _prune_everything(store) == 12  # keys, audits, adds
        assert {e.kind for e in store.read_events(0, 100)} == {"events_pruned"}
        fresh = Keyring(store)
        assert fresh.authenticate(ops) == Principal(ops_id, "acme", Role.ADMIN)
        assert fresh.authenticate(bot) == Principal(bot_id, "globex", Role.AGENT)
        with pytest.raises(AuthenticationError, match="revoked"):
            fresh.authenticate(gone)
        for token in (forged, elsewhere):
            with pytest.raises(AuthenticationError, match="unknown"):
                fresh.authenticate(token)
        fresh.revoke(bot_id)
        late_id, late = _legacy_key(store, "acme", "admin")  # an old-format event after the upgrade
    finally:
        store.close()
    again = make_store(engine_name, tmp_path, "old.db")
    again.setup()  # the migration ran once: reopening copies nothing more, and undoes nothing
    try:
        ring = Keyring(again)
        assert [k.key_id for k in ring.list()] == [ops_id]
        with pytest.raises(AuthenticationError, match="unknown"):
            ring.authenticate(late)
        assert again.get_credential("acme", API_KEY, late_id) is None
    finally:
        again.close()


def test_roles_grant_nested_permissions() -> None:
    assert PERMISSIONS[Role.READ_ONLY] < PERMISSIONS[Role.AGENT] < PERMISSIONS[Role.ADMIN]
    reader = Principal("k", "acme", Role.READ_ONLY)
    reader.require(Permission.READ)
    with pytest.raises(AccessDeniedError) as denied:
        reader.require(Permission.WRITE)
    assert denied.value.field == "role"
    Principal("k", "acme", Role.ADMIN).require(Permission.ADMIN)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_tenant_names_are_plain_and_never_reserved(name: str) -> None:
    try:
        check_tenant_name(name)
    except ValidationError as exc:
        assert exc.field == "tenant"
        return
    assert name[0].isascii() and name[0].isalnum() and len(name) <= 64
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


def test_bad_key_requests_are_refused(engine: Store) -> None:
    ring = Keyring(engine)
    for tenant in ("_auth", "", "a b", "x" * 65):
        with pytest.raises(ValidationError, match="tenant"):
            ring.create(tenant, "agent")
    with pytest.raises(ValidationError, match="role"):
        ring.create("acme", "root")
    for ttl_s in (0, -1, float("nan"), float("inf"), 1e20):  # 1e20 overflowed timedelta: a traceback
        with pytest.raises(ValidationError) as exc:
            ring.create("acme", "agent", ttl_s=ttl_s)
        assert exc.value.field == "ttl_s"
    assert ring.list() == []


def test_keys_cli_create_takes_the_tenant_clawvm_was_given(tmp_path: Path) -> None:
    """`clawvm --tenant acme keys create` and CLAWVM_TENANT=acme failed with "Missing option '--tenant'",
    and `clawvm --tenant acme keys create --tenant globex` minted a globex key without a word."""
    db = str(tmp_path / "keys.db")
    runner = CliRunner()
    assert runner.invoke(main, ["--db", db, "--tenant", "acme", "keys", "create"]).exit_code == 0
    assert runner.invoke(main, ["--db", db, "keys", "create"], env={"CLAWVM_TENANT": "globex"}).exit_code == 0
    both = runner.invoke(main, ["--db", db, "--tenant", "acme", "keys", "create", "--tenant", "globex"])
    assert both.exit_code == 2 and "'acme' and 'globex'" in both.output
    # an exported CLAWVM_TENANT gives way to the command's own --tenant
    mine = runner.invoke(
        main, ["--db", db, "keys", "create", "--tenant", "initech"], env={"CLAWVM_TENANT": "acme"}
    )
    assert mine.exit_code == 0, mine.output
    neither = runner.invoke(main, ["--db", db, "keys", "create"], env={"CLAWVM_TENANT": None})
    assert neither.exit_code == 2 and "--tenant" in neither.output
    store = SQLiteStore(db)
    store.setup()
    try:
        assert sorted(k.tenant for k in Keyring(store).list()) == ["acme", "globex", "initech"]
    finally:
        store.close()


def test_keys_cli_create_list_revoke(tmp_path: Path) -> None:
    db = str(tmp_path / "keys.db")
    runner = CliRunner()
    made = runner.invoke(
        main,
        ["--db", db, "keys", "create", "--tenant", "acme", "--role", "admin", "--name", "ops"],
        catch_exceptions=False,
    )
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    store = SQLiteStore(db)
    store.setup()
    try:
        principal = Keyring(store).authenticate(token)
        assert (principal.tenant, principal.role) == ("acme", Role.ADMIN)
        listed = runner.invoke(main, ["--db", db, "keys", "list", "--json"], catch_exceptions=False)
        row = json.loads(listed.stdout)
        assert row["key_id"] == principal.key_id and token not in listed.output
        for tenant, shown in (("acme", 1), ("globex", 0)):  # clawvm's --tenant narrows it (it was ignored)
            narrowed = runner.invoke(main, ["--db", db, "--tenant", tenant, "keys", "list", "--json"])
            assert len(narrowed.stdout.splitlines()) == shown, narrowed.output
        revoked = runner.invoke(
            main, ["--db", db, "keys", "revoke", principal.key_id], catch_exceptions=False
        )
        assert revoked.exit_code == 0
        with pytest.raises(AuthenticationError):
            Keyring(store).authenticate(token)
        assert runner.invoke(main, ["--db", db, "keys", "list"]).stdout == ""
        shown = runner.invoke(main, ["--db", db, "keys", "list", "--all"]).stdout
        assert "revoked" in shown
    finally:
        store.close()
    bad = runner.invoke(main, ["--db", db, "keys", "create", "--tenant", "_auth"])
    assert bad.exit_code == 2 and "tenant" in bad.output


@pytest.mark.parametrize("command", sorted(keys.commands))
def test_every_keys_command_has_help(command: str) -> None:
    assert {"create", "list", "revoke"} <= set(keys.commands)
    result = CliRunner().invoke(main, ["keys", command, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output
    cmd = keys.commands[command]
    assert cmd.help and all(p.help for p in cmd.params if isinstance(p, click.Option))


def test_a_malformed_key_record_is_skipped_not_fatal(engine: Store) -> None:
    ring = Keyring(engine)
    record, token = ring.create("acme", "agent")
    engine.put_credential(Credential("acme", API_KEY, "0123456789ab", {"role": "root"}))
    assert [k.key_id for k in ring.list()] == [record.key_id]
    with pytest.raises(AuthenticationError, match="unknown"):
        ring.authenticate(f"cvm_0123456789ab_{secrets.token_urlsafe(32)}")
    assert ring.authenticate(token).key_id == record.key_id
