"""Encryption at rest: data keys, envelopes (wrong key, tampering), the write path, reveal, rotation, CLI,
and the raw SQLite files holding no plaintext of protected content."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from clawvm import (
    ConfigError,
    DataKey,
    DataKeys,
    Harness,
    NotFoundError,
    RedactionPolicy,
    TamperedError,
    WrongKeyError,
)
from clawvm.cli import main
from clawvm.core.errors import AccessDeniedError, ValidationError
from clawvm.store import Store
from clawvm.store.crypto import (
    KEY_ENV,
    KEY_FILE_ENV,
    reveal_original,
    rotate_data_key,
    seal,
    sealed_envelope,
    unseal,
)
from clawvm.store.eventlog import Retention, prune
from engines import engine_of, harness_target

KEEP = RedactionPolicy(keep_original=True)
EMAIL, CARD = "alice.w@example.com", "4539 1488 0343 6467"
TOKEN = "sk-proj-Xq7nR2vLk9TzW4mPa8Yc3HbD6fJs1Ge5Uo0"
SECRET_TEXT = f"Customer {EMAIL} paid with {CARD}; the agent used {TOKEN}."


class RecordingEmbedder:
    """A deterministic embedder (hashed bag of words) that remembers every text it was asked to embed."""

    name = "recording"
    dim = 384

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.seen.extend(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
            out[row, 0] += 1e-3
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


@pytest.fixture
def keys() -> DataKeys:
    return DataKeys((DataKey.generate(),))


@pytest.fixture
def protected(engine_name: str, tmp_path: Path, keys: DataKeys) -> Iterator[Harness]:
    h = Harness.open(
        harness_target(engine_name, tmp_path), embedder=RecordingEmbedder(), redaction=KEEP, data_keys=keys
    )
    try:
        yield h
    finally:
        h.close()


# ---- keys and envelopes --------------------------------------------------------------------------
def test_keys_parse_from_env_and_files(tmp_path: Path) -> None:
    a, b = DataKey.generate(), DataKey.generate()
    assert DataKey.parse(a.encode()) == a and DataKey.parse(base64.b64encode(a.secret).decode()) == a
    assert a.kid != b.kid and len(a.kid) == 16 and a.encode() not in repr(a)
    with pytest.raises(ConfigError):
        DataKey.parse("too-short")
    assert DataKeys.from_env({}) is None
    assert DataKeys.from_env({KEY_ENV: f"{a.encode()},{b.encode()}"}) == DataKeys((a, b))
    path = tmp_path / "keys"
    DataKeys((b, a)).save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert DataKeys.from_env({KEY_FILE_ENV: str(path)}) == DataKeys((b, a))
    with pytest.raises(ConfigError):
        DataKeys.load(tmp_path / "missing")


def test_envelopes_open_only_with_their_key_and_untouched(keys: DataKeys) -> None:
    envelope = seal(keys, b"the original", b"memory-1")
    assert unseal(keys, envelope, b"memory-1") == b"the original"
    other = DataKeys((DataKey.generate(),))
    with pytest.raises(WrongKeyError) as err:
        unseal(other, envelope, b"memory-1")
    assert err.value.kid == keys.current.kid
    ct = bytearray(base64.b64decode(envelope["ct"]))
    ct[0] ^= 1
    tampered = [
        {**envelope, "ct": base64.b64encode(bytes(ct)).decode()},  # ciphertext changed
        {**envelope, "nonce": base64.b64encode(b"\0" * 12).decode()},  # nonce changed
        {**envelope, "v": 2},
        {**envelope, "ct": "not base64!"},
        {k: v for k, v in envelope.items() if k != "nonce"},
        "not an envelope",
    ]
    for bad in tampered:
        with pytest.raises(TamperedError):
            unseal(keys, bad, b"memory-1")
    with pytest.raises(TamperedError):  # moved to another memory: the associated data differs
        unseal(keys, envelope, b"memory-2")


# ---- the write path and reveal (every engine) ----------------------------------------------------
def test_content_is_stored_redacted_and_admins_reveal_the_original(protected: Harness) -> None:
    m = protected.record(SECRET_TEXT, session_id="s1")
    assert m.content == "Customer [EMAIL] paid with [CARD]; the agent used [SECRET]."
    assert protected.get(m.id).content == m.content
    info = m.metadata["redaction"]
    assert info["kinds"] == {"email": 1, "card": 1, "secret": 1}
    assert info["sealed"]["alg"] == "AES-256-GCM" and EMAIL not in json.dumps(info)
    assert protected.reveal(m.id, admin=True) == SECRET_TEXT
    with pytest.raises(AccessDeniedError):
        protected.reveal(m.id)
    assert [e.kind for e in protected.events(memory_id=m.id)][-1] == "reveal"


def test_indexes_only_ever_see_redacted_text(protected: Harness) -> None:
    m = protected.record(SECRET_TEXT)
    protected.record({"user": {"email": EMAIL, "phone": "+44 20 7946 0958"}, "ok": True})
    protected.flush()
    embedder = protected.embedder
    assert isinstance(embedder, RecordingEmbedder) and len(embedder.seen) == 2
    assert all(EMAIL not in t and "4539" not in t and "7946" not in t for t in embedder.seen)
    assert protected.recall("alice.w example.com 4539", preset="bm25", track=False) == []
    assert [h.id for h in protected.recall("customer paid", preset="bm25", track=False)] == [m.id]


def test_json_payloads_are_redacted_value_by_value(protected: Harness) -> None:
    m = protected.record({"user": {"email": EMAIL, "plan": "pro"}, "seats": 3})
    assert m.content_type == "application/json"
    assert m.content_json() == {"user": {"email": "[EMAIL]", "plan": "pro"}, "seats": 3}
    original = {"user": {"email": EMAIL, "plan": "pro"}, "seats": 3}
    assert json.loads(protected.reveal(m.id, admin=True)) == original


def test_updates_reseal_new_content_and_keep_the_seal_otherwise(protected: Harness) -> None:
    m = protected.record(SECRET_TEXT)
    forged = {"redaction": {"v": 1, "kinds": {}}, "note": "x"}
    kept = protected.update(m.id, metadata=forged, tags=["t"])
    assert kept.metadata["note"] == "x" and kept.metadata["redaction"] == m.metadata["redaction"]
    assert protected.reveal(m.id, admin=True) == SECRET_TEXT
    changed = protected.update(m.id, content="now write to bob@example.net")
    assert changed.content == "now write to [EMAIL]"
    assert protected.reveal(m.id, admin=True) == "now write to bob@example.net"
    clean = protected.update(m.id, content="nothing to hide")
    assert "redaction" not in clean.metadata  # the old seal described other text
    assert protected.reveal(m.id, admin=True) == "nothing to hide"


def test_event_log_keeps_queries_redacted(protected: Harness) -> None:
    protected.record("a note")
    protected.recall(f"what did {EMAIL} buy?", k=3)
    protected.context(f"what did {EMAIL} buy?", budget_tokens=200)
    logged = json.dumps([e.data for e in protected.events(limit=100)])
    assert EMAIL not in logged and "[EMAIL]" in logged


def test_policies_are_per_tenant(engine_name: str, tmp_path: Path, keys: DataKeys) -> None:
    only_email = RedactionPolicy.of(["email"], keep_original=True)
    with Harness.open(
        harness_target(engine_name, tmp_path), embedder=None, redaction={"acme": only_email}, data_keys=keys
    ) as h:
        assert h.record(SECRET_TEXT).content == SECRET_TEXT  # tenant "default" has no policy
        acme = h.record(SECRET_TEXT, tenant="acme")
        assert acme.content == f"Customer [EMAIL] paid with {CARD}; the agent used {TOKEN}."


def test_originals_are_kept_only_when_the_policy_says_so(engine_name: str, tmp_path: Path) -> None:
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, redaction=RedactionPolicy()) as h:
        m = h.record(SECRET_TEXT)
        assert "sealed" not in m.metadata["redaction"]
        with pytest.raises(NotFoundError):
            h.reveal(m.id, admin=True)
        plain = h.record("nothing to hide")
        assert h.reveal(plain.id, admin=True) == "nothing to hide"


def test_keeping_originals_needs_a_data_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    with pytest.raises(ConfigError):
        Harness.open("memory://", embedder=None, redaction=KEEP)
    monkeypatch.setenv(KEY_ENV, DataKey.generate().encode())
    with Harness.open("memory://", embedder=None, redaction=KEEP) as h:
        assert h.reveal(h.record(SECRET_TEXT).id, admin=True) == SECRET_TEXT


def test_a_wrong_key_is_a_specific_error(protected: Harness) -> None:
    m = protected.record(SECRET_TEXT)
    other = Harness(engine_of(protected), None, redaction=KEEP, data_keys=DataKeys((DataKey.generate(),)))
    with pytest.raises(WrongKeyError):
        other.reveal(m.id, admin=True)


def test_tampering_is_detected(protected: Harness) -> None:
    a = protected.record(SECRET_TEXT)
    b = protected.record(f"Other customer {EMAIL}")
    envelope = dict(sealed_envelope(a))
    ct = bytearray(base64.b64decode(envelope["ct"]))
    ct[-1] ^= 0x80  # a bit of the GCM tag
    bad = {**a.metadata["redaction"], "sealed": {**envelope, "ct": base64.b64encode(bytes(ct)).decode()}}
    engine_of(protected).put(a.model_copy(update={"metadata": {"redaction": bad}, "version": a.version + 1}))
    with pytest.raises(TamperedError):
        protected.reveal(a.id, admin=True)
    # a valid envelope copied onto another memory does not open there either
    moved = {**b.metadata["redaction"], "sealed": envelope}
    engine_of(protected).put(
        b.model_copy(update={"metadata": {"redaction": moved}, "version": b.version + 1})
    )
    with pytest.raises(TamperedError):
        protected.reveal(b.id, admin=True)


# ---- rotation -------------------------------------------------------------------------------------
def _kids(store: Store) -> set[str]:
    return {env["kid"] for m in store.iter_all() if (env := sealed_envelope(m))}


def test_rotation_reseals_every_original_under_the_new_key(protected: Harness, keys: DataKeys) -> None:
    ids = [protected.record(f"{SECRET_TEXT} #{i}").id for i in range(3)]
    ids.append(protected.record(SECRET_TEXT, tenant="other").id)
    protected.record("plain text, nothing sealed")
    new = DataKey.generate()
    report = rotate_data_key(engine_of(protected), keys, new)
    assert (report.kid, report.rekeyed, report.already) == (new.kid, 4, 0)
    assert _kids(protected.store) == {new.kid}
    only_new, only_old = DataKeys((new,)), keys
    for i in ids:
        m = protected.store.get(i)
        assert reveal_original(m, only_new).startswith(SECRET_TEXT)
        with pytest.raises(WrongKeyError):
            reveal_original(m, only_old)
    assert {e.tenant for e in protected.store.read_events(limit=10**6) if e.kind == "rotate_data_key"} == {
        "default",
        "other",
    }
    again = rotate_data_key(engine_of(protected), DataKeys((new,)), new)
    assert (again.rekeyed, again.already) == (0, 4)


def test_nothing_about_data_keys_depends_on_the_event_log(protected: Harness, keys: DataKeys) -> None:
    """The data keys live outside the store; each envelope names its key (``kid``) inside the memory; the
    log holds only the ``rotate_data_key`` audit line, which nothing reads. So pruning every event leaves
    every original readable and rotation working."""
    ids = [protected.record(f"{SECRET_TEXT} #{i}").id for i in range(2)]
    first = DataKey.generate()
    rotate_data_key(engine_of(protected), keys, first)
    assert prune(engine_of(protected), Retention(max_events=0), datetime.now(UTC)) > 0
    assert {e.kind for e in protected.store.read_events(0, 10)} == {"events_pruned"}
    for i in ids:
        assert reveal_original(protected.store.get(i), DataKeys((first,))).startswith(SECRET_TEXT)
    second = DataKey.generate()
    report = rotate_data_key(engine_of(protected), DataKeys((first,)), second)
    assert (report.rekeyed, report.already) == (2, 0) and _kids(protected.store) == {second.kid}
    assert reveal_original(protected.store.get(ids[0]), DataKeys((second,))).startswith(SECRET_TEXT)


def test_rotation_without_every_old_key_writes_nothing(protected: Harness, keys: DataKeys) -> None:
    m = protected.record(SECRET_TEXT)
    with pytest.raises(WrongKeyError):
        rotate_data_key(engine_of(protected), DataKeys((DataKey.generate(),)), DataKey.generate())
    assert protected.store.get(m.id).version == m.version and _kids(protected.store) == {keys.current.kid}


@pytest.mark.engines("sqlite")
def test_cli_rotates_the_data_key_in_place_and_into_a_new_file(engine_name: str, tmp_path: Path) -> None:
    key_file = tmp_path / "data.keys"
    DataKeys((DataKey.generate(),)).save(key_file)
    db = tmp_path / "cli.db"
    with Harness.open(db, embedder=None, redaction=KEEP, data_keys=DataKeys.load(key_file)) as h:
        mid = h.record(SECRET_TEXT).id
    runner = CliRunner()
    env = {KEY_ENV: "", KEY_FILE_ENV: str(key_file)}
    result = runner.invoke(main, ["--db", str(db), "keys", "rotate-data-key", "--drop-old"], env=env)
    assert result.exit_code == 0, result.output
    assert "re-encrypted 1 sealed originals" in result.output
    rotated = DataKeys.load(key_file)
    assert len(rotated.keys) == 1
    new_file = tmp_path / "next.keys"
    rotate = ["--db", str(db), "keys", "rotate-data-key"]
    result = runner.invoke(main, [*rotate, "--new-key-file", str(new_file)], env=env)
    assert result.exit_code == 0, result.output
    final = DataKeys.load(new_file)
    assert final.current.kid != rotated.current.kid
    with Harness.open(db, embedder=None, redaction=KEEP, data_keys=final) as h:
        assert h.reveal(mid, admin=True) == SECRET_TEXT
    result = runner.invoke(main, rotate, env={KEY_ENV: "", KEY_FILE_ENV: ""})
    assert result.exit_code == 2 and "data key" in result.output
    # --drop-old beside --new-key-file was ignored (the old keys stayed, exit 0): refused before any change
    before = key_file.read_bytes()
    both = [*rotate, "--new-key-file", str(tmp_path / "other.keys"), "--drop-old"]
    result = runner.invoke(main, both, env=env)
    assert result.exit_code == 2 and "--drop-old" in result.output
    assert key_file.read_bytes() == before and not (tmp_path / "other.keys").exists()


@pytest.mark.engines("sqlite")
@pytest.mark.parametrize("into", ["--key-file", "--new-key-file"])
def test_cli_rotation_refused_for_keys_of_another_store_leaves_the_key_files_as_they_were(
    engine_name: str, tmp_path: Path, into: str
) -> None:
    """A rotation refused because the keys do not open the store's sealed originals rewrote --key-file
    with a new key first (and made --new-key-file): the files are saved only once the keys are known."""
    right, wrong = tmp_path / "right.keys", tmp_path / "wrong.keys"
    DataKeys((DataKey.generate(),)).save(right)
    DataKeys((DataKey.generate(),)).save(wrong)
    db = tmp_path / "cli.db"
    with Harness.open(db, embedder=None, redaction=KEEP, data_keys=DataKeys.load(right)) as h:
        mid = h.record(SECRET_TEXT).id
    before = wrong.read_bytes()
    fresh = tmp_path / "fresh.keys"
    args = ["--db", str(db), "keys", "rotate-data-key", "--key-file", str(wrong)]
    args += ["--new-key-file", str(fresh)] if into == "--new-key-file" else []
    result = CliRunner().invoke(main, args, env={KEY_ENV: "", KEY_FILE_ENV: ""})
    assert result.exit_code == 2 and result.output.startswith("error: ") and "Traceback" not in result.output
    assert wrong.read_bytes() == before and not fresh.exists()
    with Harness.open(db, embedder=None, redaction=KEEP, data_keys=DataKeys.load(right)) as h:
        assert h.reveal(mid, admin=True) == SECRET_TEXT


# ---- the raw database files ------------------------------------------------------------------------
@pytest.mark.engines("sqlite")
def test_database_files_hold_no_plaintext_of_protected_content(engine_name: str, tmp_path: Path) -> None:
    keys = DataKeys((DataKey.generate(),))
    secrets = [EMAIL, CARD, CARD.replace(" ", ""), TOKEN, "hunter2pass!", "+44 20 7946 0958", "GB82 WEST"]
    db = tmp_path / "raw.db"

    def leaks() -> list[str]:
        raw = b"".join(p.read_bytes() for p in tmp_path.glob("raw.db*"))
        found = [s for s in secrets if s.encode() in raw]
        found += ["data key"] if keys.current.secret in raw or keys.current.encode().encode() in raw else []
        return found

    with Harness.open(db, embedder=RecordingEmbedder(), redaction=KEEP, data_keys=keys) as h:
        m = h.record(SECRET_TEXT, session_id="s1")
        h.record({"login": {"password": "hunter2pass!", "phone": "+44 20 7946 0958"}}, session_id="s1")
        h.update(m.id, content=f"{SECRET_TEXT} IBAN GB82 WEST 1234 5698 7654 32")
        h.recall(f"where is {EMAIL}?", k=5)
        h.flush()
        assert (tmp_path / "raw.db-wal").exists()
        assert leaks() == []
        assert EMAIL in h.reveal(m.id, admin=True)  # the original is there, sealed
    assert leaks() == []


@pytest.mark.engines("sqlite")
def test_a_sealed_original_moved_to_another_tenant_by_an_import_is_refused(
    engine_name: str, tmp_path: Path, keys: DataKeys
) -> None:
    """Imported into another tenant, a memory kept its envelope, sealed to the first tenant and id: the
    import succeeded and every reveal of it failed as tampered."""
    target = harness_target(engine_name, tmp_path)
    options: dict[str, Any] = {"embedder": None, "redaction": KEEP, "data_keys": keys}
    with Harness.open(target, tenant="a", **options) as a, Harness.open(target, tenant="b", **options) as b:
        sealed = a.record("mail alice@example.com about the refund")
        for restore in (False, True):
            with pytest.raises(ValidationError) as exc:
                b.import_renamed([sealed], restore=restore)
            assert exc.value.field == "memories.0.metadata.redaction.sealed" and "admin" in (
                exc.value.fix or ""
            )
        plain = sealed.model_copy(update={"metadata": {}})  # as a non-admin's export gives it
        assert b.import_renamed([plain]).imported == 1
