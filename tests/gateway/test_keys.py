"""Key store on a real SQLite file: shown once, stored hashed, revoked at once."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from inhouse.gateway.config import ConfigError, GatewayConfig
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import AuthError, KeyStore, UnknownKey, load_pepper


def test_secret_is_shown_once_and_stored_only_as_hash(store: KeyStore, tmp_path: Path) -> None:
    key, secret = store.create("alice", rpm=10)
    assert secret.startswith("ih-") and len(secret) == 3 + 43
    assert store.authenticate(secret).name == "alice"
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("gateway.db*"))
    assert secret.encode() not in raw
    assert store.hash(secret).encode() in raw
    assert key.rpm == 10 and key.models is None


def test_database_uses_wal(db_url: str) -> None:
    db = open_database(db_url)
    with db.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"


@pytest.mark.parametrize("bad", [None, "", "ih-not-a-key", "Bearer x"])
def test_unknown_or_missing_secret_is_refused(store: KeyStore, bad: str | None) -> None:
    store.create("alice")
    with pytest.raises(AuthError):
        store.authenticate(bad)


def test_revoke_applies_on_the_next_lookup_from_another_store(store: KeyStore, db_url: str) -> None:
    _, secret = store.create("alice")
    replica = KeyStore(open_database(db_url), b"test-pepper")
    assert replica.authenticate(secret).name == "alice"
    store.revoke("alice")
    with pytest.raises(AuthError) as err:
        replica.authenticate(secret)
    assert err.value.reason == "revoked"


def test_expiry_uses_the_clock(store: KeyStore, clock) -> None:
    _, secret = store.create("temp", expires_at=clock.now + 60)
    store.authenticate(secret)
    clock.advance(61)
    with pytest.raises(AuthError) as err:
        store.authenticate(secret)
    assert err.value.reason == "expired"


def test_a_different_pepper_matches_nothing(store: KeyStore, db_url: str) -> None:
    _, secret = store.create("alice")
    with pytest.raises(AuthError):
        KeyStore(open_database(db_url), b"other-pepper").authenticate(secret)


def test_update_and_unknown_names(store: KeyStore) -> None:
    store.create("alice")
    updated = store.update("alice", tpm=500, models=frozenset({"a", "b"}))
    assert updated.tpm == 500 and updated.may_use("a") and not updated.may_use("c")
    with pytest.raises(UnknownKey):
        store.revoke("bob")
    with pytest.raises(ValueError, match="already exists"):
        store.create("alice")
    with pytest.raises(TypeError):
        store.update("alice", key_hash="x")


def test_cache_salt_is_per_key_and_stable(store: KeyStore) -> None:
    a, _ = store.create("a")
    b, _ = store.create("b")
    assert store.cache_salt(a) == store.cache_salt(store.get("a")) != store.cache_salt(b)


def test_pepper_file_beside_sqlite_is_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INHOUSE_GATEWAY_PEPPER", raising=False)
    config = GatewayConfig(models=(), database=f"sqlite:///{tmp_path / 'g.db'}")
    pepper = load_pepper(config)
    path = tmp_path / "g.db.pepper"
    assert path.read_bytes() == pepper and len(pepper) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_pepper(config) == pepper


def test_non_sqlite_database_needs_a_shared_pepper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INHOUSE_GATEWAY_PEPPER", raising=False)
    config = GatewayConfig(models=(), database="postgresql://db/gateway")
    with pytest.raises(ConfigError, match="pepper_file"):
        load_pepper(config)
    monkeypatch.setenv("INHOUSE_GATEWAY_PEPPER", "shared")
    assert load_pepper(config) == b"shared"
