"""Per-key admission: concurrency, quota, RPM/TPM reservations and their reconciliation."""

from __future__ import annotations

import pytest

from inhouse.gateway.keys import KeyStore
from inhouse.gateway.limits import Gcra, KeyLimiter, MemoryTatStore, quota_exceeded


@pytest.fixture
def limiter(clock) -> KeyLimiter:
    return KeyLimiter(Gcra(MemoryTatStore(), clock))


def test_concurrency_cap_frees_on_release(store: KeyStore, limiter: KeyLimiter) -> None:
    key, _ = store.create("c", max_concurrent=2)
    assert limiter.admit(key, 10).allowed and limiter.admit(key, 10).allowed
    refused = limiter.admit(key, 10)
    assert not refused.allowed and refused.reason == "concurrency" and refused.retry_after_s
    limiter.release(key)
    assert limiter.admit(key, 10).allowed


def test_tokens_are_reserved_then_settled_to_real_usage(
    store: KeyStore, limiter: KeyLimiter
) -> None:
    key, _ = store.create("t", tpm=1000)
    first = limiter.admit(key, 600)
    assert first.allowed and first.headers["x-ratelimit-remaining-tokens"] == "400"
    refused = limiter.admit(key, 600)
    assert not refused.allowed and refused.reason == "tokens"
    assert refused.retry_after_s == pytest.approx(12.0)
    limiter.settle(key, reserved=600, charged=100)
    limiter.release(key)
    assert limiter.headers(key)["x-ratelimit-remaining-tokens"] == "900"
    assert limiter.admit(key, 600).allowed


def test_a_token_refusal_does_not_use_up_a_request(store: KeyStore, limiter: KeyLimiter) -> None:
    key, _ = store.create("rt", rpm=2, tpm=100)
    assert not limiter.admit(key, 500).allowed
    assert limiter.admit(key, 10).allowed and limiter.admit(key, 10).allowed
    assert limiter.admit(key, 10).reason == "requests"
    assert limiter.in_flight(key) == 2


def test_headers_use_openai_names(store: KeyStore, limiter: KeyLimiter) -> None:
    key, _ = store.create("h", rpm=60, tpm=6000)
    headers = limiter.admit(key, 100).headers
    assert headers == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "5900",
        "x-ratelimit-reset-tokens": "1s",
    }


def test_unlimited_keys_send_no_rate_headers(store: KeyStore, limiter: KeyLimiter) -> None:
    key, _ = store.create("free")
    admission = limiter.admit(key, 10**6)
    assert admission.allowed and admission.headers == {}


def test_withdraw_undoes_an_admission(store: KeyStore, limiter: KeyLimiter) -> None:
    key, _ = store.create("w", rpm=1, tpm=100, max_concurrent=1)
    assert limiter.admit(key, 100).allowed
    limiter.withdraw(key, 100)
    assert limiter.in_flight(key) == 0
    assert limiter.headers(key)["x-ratelimit-remaining-requests"] == "1"
    assert limiter.headers(key)["x-ratelimit-remaining-tokens"] == "100"
    assert limiter.admit(key, 100).allowed


def test_quota_exceeded_waits_for_the_period_unless_it_can_never_fit(
    store: KeyStore, clock
) -> None:
    key, _ = store.create("q", quota_tokens=1000, quota_period_s=86400)
    refused = quota_exceeded(key, 900, 200, clock.now, {})
    assert not refused.allowed and refused.reason == "insufficient_quota"
    assert refused.retry_after_s == pytest.approx(86400)
    assert "900 of 1000 used" in refused.message
    assert refused.headers == {
        "x-ratelimit-limit-quota-tokens": "1000",
        "x-ratelimit-remaining-quota-tokens": "100",
        "x-ratelimit-reset-quota-tokens": "24h0m0s",
        "x-should-retry": "false",  # a day away: no client retry can pass
    }
    never = quota_exceeded(key, 0, 1001, clock.now, {})
    assert never.retry_after_s is None and never.headers["x-should-retry"] == "false"
    soon, _ = store.create("q-soon", quota_tokens=1000, quota_period_s=30)
    assert "x-should-retry" not in quota_exceeded(soon, 900, 200, clock.now, {}).headers


def test_a_concurrency_refusal_says_the_cap(store: KeyStore, limiter: KeyLimiter) -> None:
    key, _ = store.create("c-headers", max_concurrent=2)
    assert limiter.admit(key, 0).allowed and limiter.admit(key, 0).allowed
    refused = limiter.admit(key, 0)
    assert refused.reason == "concurrency" and refused.retry_after_s == 1.0
    assert refused.headers == {
        "x-ratelimit-limit-concurrency": "2",
        "x-ratelimit-remaining-concurrency": "0",
    }


def test_an_unmetered_call_takes_a_slot_but_no_request_or_tokens(
    store: KeyStore, limiter: KeyLimiter
) -> None:
    key, _ = store.create("u", rpm=1, tpm=10, max_concurrent=1)
    assert limiter.admit(key, 0, metered=False).allowed  # /tokenize: no model runs
    assert not limiter.admit(key, 0, metered=False).allowed  # the slot is still taken
    limiter.release(key)
    first = limiter.admit(key, 10)
    assert first.allowed, "the unmetered call used up the request or token budget"
    limiter.release(key)
    assert limiter.admit(key, 0, metered=False).allowed  # while the minute's budget is spent
    limiter.release(key)
    assert not limiter.admit(key, 1).allowed
