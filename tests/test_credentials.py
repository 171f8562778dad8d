"""The credentials table of the storage contract, on every engine: compare-and-set writes, lookups by
name across tenants, keyset paging, tenant confinement, persistence, and event retention never reaching it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clawvm.core.errors import AccessDeniedError, ValidationError
from clawvm.store import Credential, CredentialConflictError, Event, Store
from clawvm.store.eventlog import Retention, prune
from clawvm.store.migrate import migrate, summarize
from clawvm.store.tenant import TenantStore
from engines import make_store


def _cred(tenant: str, name: str, version: int = 1, kind: str = "api_key", **data: object) -> Credential:
    return Credential(tenant, kind, name, {"n": version, **data}, version)


def test_a_credential_is_stored_and_found_by_kind_and_name(engine: Store) -> None:
    engine.put_credential(_cred("acme", "k1", label="ops", nested={"a": [1, 2]}))
    assert engine.find_credentials("api_key", "k1") == [
        _cred("acme", "k1", label="ops", nested={"a": [1, 2]})
    ]
    assert engine.get_credential("acme", "api_key", "k1") == _cred(
        "acme", "k1", label="ops", nested={"a": [1, 2]}
    )
    assert engine.get_credential("globex", "api_key", "k1") is None
    assert engine.find_credentials("api_key", "k2") == [] and engine.find_credentials("other", "k1") == []


def test_what_a_caller_holds_is_a_copy(engine: Store) -> None:
    given = _cred("acme", "k1", tags=["a"])
    engine.put_credential(given)
    given.data["tags"].append("changed by the caller")
    got = engine.find_credentials("api_key", "k1")[0]
    got.data["tags"].append("changed by a reader")
    assert engine.find_credentials("api_key", "k1")[0].data["tags"] == ["a"]


def test_writes_are_compare_and_set_on_the_version(engine: Store) -> None:
    engine.put_credential(_cred("acme", "k1"))
    with pytest.raises(CredentialConflictError) as twice:  # a second create of the same key
        engine.put_credential(_cred("acme", "k1", state="second"))
    assert (twice.value.expected, twice.value.actual) == (0, 1) and "credential" in str(twice.value)
    engine.put_credential(_cred("acme", "k1", 2, state="revoked"))
    for stale in (2, 4):  # the version just written again, and one skipping ahead
        with pytest.raises(CredentialConflictError):
            engine.put_credential(_cred("acme", "k1", stale, state="lost"))
    assert engine.find_credentials("api_key", "k1") == [_cred("acme", "k1", 2, state="revoked")]


def test_a_new_credential_keeps_the_version_it_carries(engine: Store) -> None:
    engine.put_credential(_cred("acme", "copied", 7))  # a copy from another store keeps its version
    engine.put_credential(_cred("acme", "copied", 8))
    assert engine.find_credentials("api_key", "copied")[0].version == 8


def test_only_one_of_concurrent_writers_of_a_version_wins(engine: Store) -> None:
    engine.put_credential(_cred("acme", "k1"))
    outcomes: list[str] = []
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        start.wait()
        try:
            engine.put_credential(_cred("acme", "k1", 2, writer=n))
            outcomes.append("won")
        except CredentialConflictError:
            outcomes.append("lost")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    stored = engine.find_credentials("api_key", "k1")
    assert len(stored) == 1 and stored[0].version == 2


def test_the_same_name_under_two_tenants_is_two_credentials(engine: Store) -> None:
    engine.put_credential(_cred("globex", "shared", owner="globex"))
    engine.put_credential(_cred("acme", "shared", owner="acme"))
    engine.put_credential(_cred("acme", "shared", 2, owner="acme"))
    found = engine.find_credentials("api_key", "shared")
    assert [(c.tenant, c.version, c.data["owner"]) for c in found] == [
        ("acme", 2, "acme"),
        ("globex", 1, "globex"),
    ]


def test_listing_pages_in_tenant_kind_name_order(engine: Store) -> None:
    made = [
        _cred(tenant, name, kind=kind)
        for tenant in ("b-tenant", "a-tenant", "Z")
        for kind in ("api_key", "data_key")
        for name in ("k2", "k10", "K1", "k\\1", "ké")
    ]
    for c in made:
        engine.put_credential(c)
    ordered = sorted(made, key=lambda c: (c.tenant, c.kind, c.name))
    assert engine.list_credentials(limit=len(made) + 1) == ordered
    pages: list[list[Credential]] = []
    after = None
    while not pages or len(pages[-1]) == 4:
        pages.append(engine.list_credentials(after=after, limit=4))
        after = pages[-1][-1] if pages[-1] else None
    assert [c for page in pages for c in page] == ordered and [len(p) for p in pages] == [4] * 7 + [2]
    assert engine.list_credentials("data_key", "a-tenant") == [
        c for c in ordered if c.tenant == "a-tenant" and c.kind == "data_key"
    ]
    assert list(engine.iter_credentials("api_key", batch=3)) == [c for c in ordered if c.kind == "api_key"]
    assert engine.list_credentials(tenant="nobody") == [] and engine.list_credentials("nothing") == []


@pytest.mark.parametrize(
    "bad",
    [
        Credential("", "api_key", "k"),
        Credential("acme", "", "k"),
        Credential("acme", "api_key", ""),
        Credential("acme", "api_key", "k\x00"),
        Credential("acme", "api_key", "k", version=0),
        Credential("acme", "api_key", "k", {"when": datetime(2020, 1, 1, tzinfo=UTC)}),
        Credential("acme", "api_key", "k", {"x": float("nan")}),
    ],
)
def test_malformed_credentials_are_refused_and_nothing_is_written(engine: Store, bad: Credential) -> None:
    with pytest.raises(ValidationError):
        engine.put_credential(bad)
    assert engine.list_credentials() == []


def test_event_retention_never_reaches_credentials(engine: Store) -> None:
    engine.put_credential(_cred("acme", "k1"))
    engine.append_events([Event(kind="add", memory_id=f"m{i}", tenant="acme") for i in range(5)])
    engine.put_credential(_cred("acme", "k1", 2, state="revoked"))
    deleted = prune(engine, Retention(max_events=0), datetime.now(UTC))
    assert deleted == 5 and {e.kind for e in engine.read_events(0, 100)} == {"events_pruned"}
    assert engine.list_credentials() == [_cred("acme", "k1", 2, state="revoked")]


@pytest.mark.engines("sqlite", "postgres")
def test_credentials_persist_across_reopening(engine_name: str, tmp_path: Path) -> None:
    first = make_store(engine_name, tmp_path, "persist.db")
    first.setup()
    first.put_credential(_cred("acme", "k1"))
    first.put_credential(_cred("acme", "k1", 2, state="revoked"))
    first.close()
    again = make_store(engine_name, tmp_path, "persist.db")
    again.setup()
    try:
        assert again.find_credentials("api_key", "k1") == [_cred("acme", "k1", 2, state="revoked")]
        with pytest.raises(CredentialConflictError):
            again.put_credential(_cred("acme", "k1", 2))
    finally:
        again.close()


def test_a_tenant_view_sees_and_writes_only_its_own_credentials(engine: Store) -> None:
    engine.put_credential(_cred("acme", "shared", owner="acme"))
    engine.put_credential(_cred("globex", "shared", owner="globex"))
    engine.put_credential(_cred("globex", "only-globex"))
    acme = TenantStore(engine, "acme")
    assert [c.tenant for c in acme.find_credentials("api_key", "shared")] == ["acme"]
    assert acme.find_credentials("api_key", "only-globex") == []
    assert acme.get_credential("globex", "api_key", "shared") is None
    assert [c.tenant for c in acme.list_credentials()] == ["acme"]
    assert acme.list_credentials(tenant="globex") == [] and list(acme.iter_credentials(tenant="globex")) == []
    with pytest.raises(AccessDeniedError):
        acme.put_credential(_cred("globex", "shared", 2, owner="acme"))
    with pytest.raises(AccessDeniedError):
        acme.put_credential(_cred("globex", "new"))
    acme.put_credential(_cred("acme", "shared", 2, owner="acme"))
    assert [(c.tenant, c.version) for c in engine.find_credentials("api_key", "shared")] == [
        ("acme", 2),
        ("globex", 1),
    ]
    assert engine.get_credential("globex", "api_key", "new") is None


def test_migrate_copies_credentials_and_refuses_a_target_holding_some(
    engine_name: str, tmp_path: Path
) -> None:
    source = make_store(engine_name, tmp_path, "source.db")
    target = make_store("sqlite", tmp_path, "target.db")
    busy = make_store("memory", tmp_path)
    for store in (source, target, busy):
        store.setup()
    try:
        source.put_credential(_cred("acme", "k1"))
        source.put_credential(_cred("acme", "k1", 2, state="revoked"))
        source.put_credential(_cred("globex", "k2", kind="data_key"))
        report = migrate(source, target)
        assert report.credentials == 2 and report.target is not None and report.target.credentials == 2
        assert target.list_credentials() == source.list_credentials()
        assert summarize(target) == summarize(source)
        busy.put_credential(_cred("acme", "left-over"))
        with pytest.raises(ValidationError, match="credentials"):
            migrate(source, busy)
    finally:
        for store in (source, target, busy):
            store.close()
