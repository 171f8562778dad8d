"""API keys: stored hashed in the store's event log, one tenant and one role each, revocable anywhere."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm.cli import keys, main
from clawvm.core.errors import AccessDeniedError, AuthenticationError, NotFoundError, ValidationError
from clawvm.store import SQLiteStore, Store
from clawvm.store.keys import (
    AUTH_TENANT,
    KEYS_STREAM,
    PERMISSIONS,
    Keyring,
    Permission,
    Principal,
    Role,
    check_tenant_name,
)
from clawvm.store.tenant import TenantStore


def test_a_key_authenticates_as_its_tenant_and_role(engine: Store) -> None:
    ring = Keyring(engine)
    record, token = ring.create("acme", "agent", "deploy bot")
    assert token.startswith(f"cvm_{record.key_id}_") and len(token) > 50
    assert ring.authenticate(token) == Principal(record.key_id, "acme", Role.AGENT)
    assert record.hash == hashlib.sha256(token.encode()).hexdigest()


def test_only_the_hash_is_stored(engine: Store) -> None:
    ring = Keyring(engine)
    _, token = ring.create("acme", "admin")
    logged = json.dumps([e.data for e in engine.read_events(0, 10**6)])
    secret = token.split("_", 2)[2]
    assert secret not in logged and hashlib.sha256(token.encode()).hexdigest() in logged


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


def test_events_logged_by_a_tenant_under_the_keys_stream_are_ignored(engine: Store) -> None:
    from clawvm.store import Event

    fake = {"key_id": "0123456789ab", "tenant": "acme", "role": "admin", "name": "", "hash": "0" * 64}
    engine.append_event(Event(kind="key_created", memory_id=KEYS_STREAM, tenant="acme", data=fake))
    assert Keyring(engine).list() == []


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
    assert ring.list() == []


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
